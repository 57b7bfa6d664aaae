"""Data: reading volumes in RAS with their spacing (:mod:`.reading`; DICOM series: :mod:`.dicom`), labels and regions
(:mod:`.labels`), the dataset lists of MSD and nnU-Net folders and their splits (:mod:`.datalist`), the demo dataset
(:mod:`.demo`), the MONAI transforms of training and evaluation (:mod:`.transforms`) and the data check
(:mod:`.verify`)."""
