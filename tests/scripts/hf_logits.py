"""Logits of an exported model under Hugging Face ``transformers`` (needs torch + transformers).

    python tests/scripts/hf_logits.py MODEL_DIR IDS.npy OUT.npy

Loads MODEL_DIR with AutoModelForCausalLM (float32, eager attention), runs the ids (B, N)
and saves the logits (B, N, V) as float64.  Run by tests/test_export_hf.py in whatever
Python has transformers (this one or MINIPAR_HF_PYTHON).
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

model_dir, ids_path, out_path = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
ids = torch.from_numpy(np.load(ids_path).astype(np.int64))
with torch.no_grad():
    logits = model(input_ids=ids).logits
np.save(out_path, logits.double().numpy())
print(type(model).__name__, tuple(logits.shape))
