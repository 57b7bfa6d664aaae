"""A checkpoint to probabilities in the input's geometry: the sliding window (:mod:`.sliding_window`), the model of a
checkpoint (:mod:`.model`), one case's inference (:mod:`.inferer`), an ensemble (:mod:`.ensemble`), the cases of an
input (:mod:`.cases`), the files written (:mod:`.output`; DICOM-SEG: :mod:`.dicom_seg`) and the checks of an evaluate
config (:mod:`.settings`)."""
