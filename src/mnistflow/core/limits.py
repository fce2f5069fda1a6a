"""The bounds on untrusted input, in one place: the threat model on one screen.

Untrusted: the files a user points mnistflow at (raw data, record sets, model files,
checkpoints, npz and ONNX files, a --config file, and a run's own files when read back), the
HTTP requests ``serve`` answers, and command-line and environment values. The rule: every size
or count such an input declares (a header's shape, a length prefix, a file's size, a flag) is
checked against these before any memory is sized from it; past one is one error line. Each
bound is far above any real MNIST-family input, so only a broken or hostile input meets it, and
what passed is trusted inside. One model format is code, not data: a ``.pt2`` program
(``artifacts.pt2``) is loaded only on the user's word (``$MNISTFLOW_TRUST_PT2=1``;
torch.export.load unpickles, its graph calls what it names); only its size and its mnistflow
info are bounded here, to catch a broken or foreign file. Not here: the plain ranges of settings (a learning rate, epochs:
``training.config``), the server's time and concurrency limits (``server.guard.Limits``), and
design limits (an ensemble's members). Standard library only, so every layer can import it.
"""
from __future__ import annotations

# --- images and datasets --------------------------------------------------------------------
MAX_SIDE = 4096  # pixels a side: --input, --resize, a layer spec's kernel, pool window or stride
MAX_CHANNELS = 64  # channels of a model's input (--channels, a model file): the data have 1 or 3
MAX_UNITS = 2**31 - 1  # a layer spec's channels or units (--model, a model file): an int32, torch's index
MAX_CLASSES = 100_000  # classes of a dataset or model; every label value is below it
MAX_PIXELS = 4096 * 4096  # pixels of one picture decoded from a file (--max-pixels changes it)
MAX_DATASET_BYTES = 16 << 30  # the decoded images of one dataset
MAX_VARIANTS = 100  # augmented copies of the training images prep writes, each a full copy

# --- data formats ---------------------------------------------------------------------------
MAX_CSV_LINE_BYTES = 1 << 24  # one CSV line (one image): a 2048x2048 grey image at 4 bytes a value
MAX_TFRECORD_BYTES = 1 << 26  # one TFRecord record (an Example holds one image)
MAX_EMNIST_MAPPING_BYTES = 1 << 16  # an EMNIST mapping file (the largest, byclass, is ~600 bytes)
MAX_CIFAR_BATCH_IMAGES = 10_240  # images of one CIFAR-10 batch (a real one holds 10,000)
# a CIFAR-10 batch file or tar member (~31 MB; re-pickled at protocol 2, up to 2 bytes a pixel)
MAX_CIFAR_BATCH_BYTES = MAX_CIFAR_BATCH_IMAGES * (2 * 3072 + 256) + (1 << 20)
MAX_PICKLE_OPS = 32 * MAX_CIFAR_BATCH_IMAGES  # opcodes of one batch's pickle (a real one: ~9 an image)
MAX_TAR_MEMBERS = 1000  # members of the CIFAR-10 archive (it has 8)
MAX_NPY_HEADER_BYTES = 1 << 16  # the header of one .npy array (an npz member, a record file)
MAX_RECORDS_META_BYTES = 1 << 24  # a record set's meta.json (names and checksums: kilobytes)
MAX_RECORD_VALUES = 1 << 28  # H * W * C of one image, as a record set's meta.json declares it

# --- the files of a run, and model files ----------------------------------------------------
# A model file (safetensors, ONNX, .pt2) is read whole: 40 times the largest registered model in fp32.
MAX_MODEL_BYTES = 512 << 20
MAX_CHECKPOINT_BYTES = 4 * MAX_MODEL_BYTES  # read whole: the weights, two optimizer moments, the rest
MAX_POINTER_BYTES = 4096  # a checkpoint folder's ``last`` / ``best`` file: one file name
MAX_SAFETENSORS_HEADER_BYTES = 64 << 20  # a safetensors JSON header (names, shapes, metadata)
MAX_MODEL_META_CHARS = 16 << 20  # a model's metadata JSON (in a model file or an npz)
MAX_MODEL_NAME = 10_000  # characters of a model's name or layer spec
MAX_CLASS_NAME = 1_000  # characters of one class name
MAX_INPUT_VALUES = 1 << 24  # C * H * W of a model's input image
MAX_NPZ_BYTES = 4 << 30  # all arrays of one npz together, as their headers declare them
MAX_NPZ_FILE_BYTES = MAX_NPZ_BYTES + (64 << 20)  # the npz file: its arrays, headers, zip directory
MAX_ONNX_VALUES = 1 << 30  # initializer elements of one ONNX model, all together
MAX_RUN_FILE_BYTES = 4 << 20  # summary.json or config.toml read back (a few KiB as written)
# metrics.jsonl as a report reads it: streamed (~4 million logged steps), and of each kind of
# record at most 2 x MAX_PLOT_POINTS kept, evenly spread (a plot is a thousand pixels wide)
MAX_METRICS_BYTES = 1 << 30
MAX_PLOT_POINTS = 2048
MAX_COMPARE_RUNS = 32  # runs one report compares (--compare): each held, thinned, at once
MAX_METRICS_LINE = 1 << 20  # bytes of one metrics.jsonl record; a longer line is not one of ours
MAX_TOML_BYTES = 1 << 20  # a --config file (a few hundred bytes)

# --- the server (defaults of ``server.guard.Limits``, which a server may change) ------------
MAX_BODY_BYTES = 2 << 20  # one request body
MAX_REQUEST_PIXELS = 2048 * 2048  # decoded pixels of one posted image (after JPEG draft scaling)
MAX_JSON_SIDE = 1024  # pixels a side of a posted JSON pixel array
MAX_FORM_FIELDS = 16  # text fields of a multipart upload besides its one file (preprocess: one)
MAX_FORM_FIELD_BYTES = 64 << 10  # one text field of a multipart upload
# activation values of one /api/layers answer, all layers together (``artifacts.layers`` keeps the
# most active channels of wider layers), and of one /api/kernel answer: seed-cnn's hold ~63,000
MAX_LAYER_VALUES = 1 << 21

# --- issue 40 (server): connections and decode cost -------------------------------------------
# a request's line and headers (default of ``server.guard.Limits.max_header_bytes``; 431 past it):
# a browser's are a few KB; h11 allows 16 KiB, nginx 4 x 8 KiB
MAX_HEADER_BYTES = 32 << 10
MAX_PIPELINED = 64  # requests one connection may send ahead of the answer in progress (closed past it)
# after refusing a request whose body is still arriving, the server reads and discards this much
# for this long before closing (a client that sends the whole body first then reads the answer)
LINGER_BYTES = 64 << 20
LINGER_SECONDS = 2.0
# scans (SOS markers) of one JPEG, counted before decoding: each scan is a pass over the whole
# image (93,000 scans in 2 MB cost 48 s); libjpeg writes 6 to 10 for a progressive picture
MAX_JPEG_SCANS = 100

# --- the command line and the environment ---------------------------------------------------
MAX_INT = 2**63 - 1  # an integer flag or config.toml value with no smaller bound: 64 bits, as TOML's
# --seed (train, prep): seeds derived from it (seed * 1_000_003 + epoch, ...) stay inside the
# 64 bits torch.Generator takes; 32-bit seeds leave that room, as numpy's legacy range
MAX_SEED = 2**32 - 1
MAX_THREADS = 1024  # --threads, $MNISTFLOW_THREADS: intra-op threads; more is a typo, not a machine
MAX_LOCAL_PROCESSES = 1024  # processes on one machine: --nproc, torchrun's $LOCAL_WORLD_SIZE
MAX_WORLD_SIZE = 1 << 20  # processes of one run on all machines: torchrun's $WORLD_SIZE
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600.0  # $MNISTFLOW_DIST_TIMEOUT, a week: inf or 1e30 would overflow the timer
MAX_RESTARTS = 10_000  # --max-restarts: restarts of the --nproc group (torchrun's own flag has no bound)

# --- issue 40 (dl): downloads, foreign ONNX graphs -----------------------------------------
# Downloads (``data.known.download``). A file's own size is in the dataset table
# (``data.known.RemoteFile.size``); a file the table gives no size (a toy dataset in the tests)
# may hold twice the largest known file, EMNIST's 561,753,746-byte zip.
MAX_DOWNLOAD_BYTES = 2 * 561_753_746
MAX_DOWNLOAD_RESUMES = 20  # tries at one mirror that ended after new bytes (each resumed at once)
MIN_DOWNLOAD_RATE = 4096  # bytes/s over each timeout window ($MNISTFLOW_DOWNLOAD_TIMEOUT): slower is a stall
# ONNX graphs (``artifacts.onnx_check``): the operators a model file may use: those mnistflow's
# exports hold (every registered model, ensemble and layer spec, float and int8:
# tests/integration/test_export.py checks it), then common stateless layers a custom model
# exports. No control flow (Loop, Scan, If), no operator whose output size comes from a
# tensor's values at run time (ConstantOfShape, Expand, Tile, Range, Resize, NonZero, ...).
ONNX_OPS = frozenset((
    "Add", "AveragePool", "BatchNormalization", "Conv", "DequantizeLinear", "Div", "Gelu", "Gemm",
    "Log", "MaxPool", "Mul", "QuantizeLinear", "ReduceMean", "Relu", "Reshape", "Sigmoid", "Softmax",
    "Tanh", "Transpose",  # the exports'
    "Abs", "Clip", "Concat", "Dropout", "Elu", "Erf", "Exp", "Flatten", "GlobalAveragePool",
    "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity", "LayerNormalization", "LeakyRelu",
    "LogSoftmax", "MatMul", "Max", "Min", "Neg", "Pad", "PRelu", "Selu", "Softplus", "Sqrt",
    "Squeeze", "Sub", "Unsqueeze",
))
# Every tensor's shape is inferred before the graph runs. For one image (and again for the
# tensors computed from the weights alone), at most: the largest export (resnet-small, 3x32x32)
# needs 664,000 values and 106 million operations an image.
MAX_ONNX_IMAGE_VALUES = 1 << 26  # values of all its tensors together
MAX_ONNX_IMAGE_OPS = 1 << 34  # multiply-adds (convolutions, matrix products) and other operations
# One onnxruntime call takes at most as many images as keep it under these, and is stopped
# after MAX_ONNX_RUN_SECONDS (its terminate flag; a server stops it at its work deadline).
MAX_ONNX_BATCH_VALUES = 1 << 28  # ~1 GiB of float32 tensors
MAX_ONNX_BATCH_OPS = 1 << 36  # resnet-small: 528 images, ~6 s on one busy core
MAX_ONNX_RUN_SECONDS = 120.0
