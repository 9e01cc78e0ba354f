"""Images for Qwen3.5 through an mmproj GGUF (projector qwen3vl_merger), as llama.cpp's mtmd does:
config.py (the GGUF), preprocess.py (decode, smart resize, normalise), encoder.py (the tower on backend ops),
positions.py (2-D rotary ids, IMROPE positions of image tokens), session.py (a loaded projector + image cache)."""
