"""The predict stage: a checkpoint to segmentations in the input's geometry. The sliding window
(:mod:`.sliding_window`), the backends that run the network on it (:mod:`.backends`), the model of a checkpoint
(:mod:`.model`), one case's inference (:mod:`.inferer`), an ensemble (:mod:`.ensemble`), the cases of an input
(:mod:`.cases`), the files written (:mod:`.output`; DICOM-SEG: :mod:`.dicom_seg`), the checks of a prediction's config
(:mod:`.checks`) and the stage itself over every case (:mod:`.predict`)."""
