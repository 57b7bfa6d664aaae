"""medseg's Hydra configs, installed as the package ``medseg.configs`` (pyproject.toml maps it to this folder): the
YAML files are its package data. This file makes it a regular package, which an editable install imports too, and
marks the installed configs (:func:`medseg.hydra_config.find_config_dir`)."""
