"""waferrt.estimator: the whole wafer on paper -- closed forms, no emulation (training: ``train``)."""
