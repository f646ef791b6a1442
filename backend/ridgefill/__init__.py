"""RidgeFill: skip late layers' prefill work for bulk rows, write their KV cache from ridge maps.

Where things are (no imports here, so importing the package costs nothing):
- ggml_graph        ctypes view of ggml tensors + the layout self-check (refuse when it fails)
- stream_capture    capture_streams: the stream entering chosen layers, from the exact model (in memory)
- cache_layout      discover: each layer's KV cache tensors, cell-index inputs and RoPE parameters
- kv_writer         the torch K/V path of a late layer, written as F16 into llama.cpp's cache
- injection         run_plan (plan.ridgefill_prefill calls it): speed / guided / quality / plumb, the graph cut
- defaults          default split and tail per model, MIN_BULK
- quality_rows      quality's choice of the bulk rows to make exact again
- redecode          redecode_exact: chosen bulk rows decoded again through every layer (quality, guided)
- refine            Refinement: in idle time, every row from the first unclean one made exact, in order
- calibration       the calibration run: calibration_corpus (the text) -> capture_plan (its parts, the
                    disk check) -> activation_store (the activations on disk, read back by the fit)
- maps, fitting, fingerprint, map_format, map_store   ridge maps (fit, store, verify)
"""
