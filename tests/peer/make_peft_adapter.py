"""Makes a LoRA adapter with Hugging Face's own peft library for
llm-mkmodel's "tiny" llama shape (n_embd 256, n_ff 512, 2 layers, 4 heads,
2 K/V heads, vocab 512), as a trained adapter is shipped:
OUT/adapter/{adapter_config.json, adapter_model.safetensors}, and the
base's config.json (OUT/base) that llama.cpp's convert_lora_to_gguf.py
reads with --base. tests/peer/make_lora_refs.py runs it (under
PEFT_PYTHON, a Python with torch, transformers and peft) and converts the
adapter with llama.cpp's script.

    PYTHON make_peft_adapter.py OUT"""
import pathlib
import sys

import peft
import torch
import transformers


def main():
    out = pathlib.Path(sys.argv[1])
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
                                   architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg), peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    # peft starts B at zero (no change before training): seeded values stand in for training
    g = torch.Generator().manual_seed(43)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(out / "adapter")
    cfg.save_pretrained(out / "base")
    print(f"peft {peft.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    sys.exit(main())
