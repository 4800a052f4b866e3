# Writes a byte-level BPE tokenizer with no merges (one token per byte, ids 0-255) and ChatML
# specials (<|endoftext|> 256, <|im_start|> 257, <|im_end|> 258) into the directory argv[1]:
# tokenizer.json and tokenizer_config.json with a ChatML chat template. Used by e2e scripts.
import json, os, sys
d = sys.argv[1]; os.makedirs(d)
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, s in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
json.dump({"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": []}}, open(os.path.join(d, "tokenizer.json"), "w"))
tmpl = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": tmpl},
          open(os.path.join(d, "tokenizer_config.json"), "w"))
