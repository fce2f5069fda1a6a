"""Everything a run leaves on disk, and how it is read back.

    rundir      the run directory's layout (config.toml, metrics.jsonl, summary.json, tb/, ...)
    checkpoint  the checkpoint file format (a torch.save zip, checksummed) and keep-N rotation
    model_info  ModelInfo (what a saved model says about itself) and its check when read back
    model_file  model.safetensors, rebuilding a model, the one strict weight loader
    npz         parameters by name as .npz (export, --init-from)
    onnx        ONNX bytes from a model, the onnxruntime session, the ONNX predictor backend
    onnx_check  what an ONNX file must be before it runs (operators, inferred sizes, weights)
    pt2         a torch.export program (.pt2) from a model, and one loaded back as a module
    predictor   uint8 images -> class probabilities, for PyTorch and ONNX alike
    layers      one image -> every layer's activations (forward hooks), a conv channel's kernel
    load        load_any: a model (or ONNX backend) from any of these files or a run directory

Nothing here decides *when* to write (that is ``training``) or what a verb does with a model.
"""
