"""waferrt.estimator: the whole wafer on paper (pure: no Ray, no sockets, no model files, no matplotlib).

Contract: a floor of its own above the emulator-scale planning (waferrt.scheduler), whose value types and
placement speed (``scheduler.speed``) it shares. ``estimate.estimate`` plans a model on a whole wafer
analytically and estimates its decode (the floor plans of ``wafer``, what would fit from ``advice``, the
report of ``estimate_report``); ``streaming`` the same with weights streamed in; ``prefill`` a prompt's
prefill and its hand-over to the decode; ``moe_estimate`` a mixture-of-experts model; ``sweep`` hardware
designs under an area budget; ``train`` a training step on paper (weight streaming, a 1F1B pipeline,
tensor-stream partition) and ``train_sweep`` the co-exploration of strategies and wafer templates;
``fidelity`` the modelled WSE-2 kernels against the WaferLLM paper's figures.
Every cycle and byte comes from the owners the emulator's tiles call (waferrt.core.cost, waferrt.decode).
"""
