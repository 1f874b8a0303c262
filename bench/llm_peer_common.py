"""What the Python LLM peers (bench/peer_llm.py, bench/peer_fsdp.py) and the scripts that run them
share: the random Llama they train, and the padding of `mgbench data stats --dump` rows."""
import sys

import torch


def padded(rows, pad_id):
    """[(tokens, labels)] -> ids and labels [len(rows), longest], right-padded (labels with -100)."""
    length = max(len(t) for t, _ in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, (t, l) in enumerate(rows):
        ids[i, :len(t)] = torch.tensor(t)
        labels[i, :len(l)] = torch.tensor(l)
    return ids, labels


def save_random_llama(out, hidden, layers, intermediate=None):
    """A random Llama (vocab 2256: tiktoken_small's; 8 heads, 4 KV heads, MLP of `intermediate`, by default
    2.6875 x hidden; seed 0) saved with transformers."""
    import transformers
    torch.manual_seed(0)
    intermediate = intermediate or int(hidden * 2.6875)
    cfg = transformers.LlamaConfig(vocab_size=2256, hidden_size=hidden, intermediate_size=intermediate,
                                   num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                   head_dim=hidden // 8, max_position_embeddings=4096, rope_theta=500000.0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)


if __name__ == "__main__":  # llm_peer_common.py OUT HIDDEN LAYERS [INTERMEDIATE]: the random Llama
    save_random_llama(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
