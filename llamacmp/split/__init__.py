"""Layer split over several backends (llama.cpp's `-sm layer`): each backend -- one GPU, or a numpy reference
standing in for one -- holds a contiguous range of layers, and the hidden state x [T, D] f32 crosses from one part
to the next through a bridge.

The model is written once, per architecture (models/): a split runs any model class whose constructor takes a layer
range and whether to hold the embedding and the head, and which has the three steps embed / run_layers / head
(models/qwen35.py). The loader passes the file's class (loader.load_split_model).

The files: placement.py (which layers go where), bridges.py (how x crosses), model.py (the runner: parts on their
own threads, pipelined prefill), backend.py (the split as the engine's backend: states spread over the parts and
their prompt-cache copies), graphs.py (decode steps as one captured CUDA graph per part), devices.py (one
CudaBackend per device).
"""
