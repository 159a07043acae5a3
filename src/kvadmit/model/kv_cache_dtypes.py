"""--kv-cache-dtype's choices kvadmit stores (model/kv_quant.py stores them), without importing torch: the
command line checks them before any model, and `serve --simulate` never imports torch."""

INT8_KV = "int8"  # kvadmit's own choice (SGLang 0.5.22 has no int8): 8 bits and a scale per token and head
KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", INT8_KV)
