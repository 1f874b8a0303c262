#!/usr/bin/env python3
"""References for mgbench's quantised fine-tuning, from torchao 0.11.0 and TorchTune 0.6.1 (run by
make_oracles.py in a process of its own, with the folder TorchTune is installed in on PYTHONPATH):

    quant_oracles.py OUT_FILE STORIES260K_BIN

Writes OUT_FILE (torch.save of a dict of tensors), keys by case:
  nf4.<case>.{weight,quantized_data,quantized_scalers,quantization_factor,scaler_mean,dequantized}
      torchao's to_nf4 and get_original_weight, bf16, fp16 and fp32, random normal and uniform weights and a
      real trained one (stories260K's token embedding table, [512, 64]);
  qlora.{weight,lora_a,lora_b,x,grad_y,y,y_disabled,grad_x,grad_lora_a,grad_lora_b}
      TorchTune's LoRALinear(256 -> 128, rank 8, alpha 16, quantize_base=True) in bf16 on CPU;
  qat.<case>.{weight,x,grad_y,x_fq,weight_fq,y,grad_x,grad_weight,y_disabled,values,scales,zeros}
      Int8DynActInt4WeightQATQuantizer(groupsize=G).prepare() of a bias-free linear, its fake
      quantisers, outputs and gradients, with fake quantisation disabled, and convert()'s int4 weight;
  qat_lora.{weight,lora_a,lora_b,x,grad_y,y,grad_x,grad_lora_a,grad_lora_b}
      TorchTune's QATLoRALinear(512 -> 64, rank 4, alpha 8) with the 8da4w configs, group 256, bf16.
"""
import struct
import sys
import types

for name in ("datasets", "datasets.distributed"):  # imported by torchtune.data, never used here
    m = types.ModuleType(name)
    m.load_dataset, m.Dataset, m.split_dataset_by_node = None, object, None
    sys.modules[name] = m
sys.modules["datasets"].distributed = sys.modules["datasets.distributed"]

import torch  # noqa: E402
from torchao.dtypes.nf4tensor import to_nf4  # noqa: E402
from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer  # noqa: E402
from torchao.quantization.qat.linear import _get_8da4w_activation_config, _get_8da4w_weight_config  # noqa: E402
from torchtune.modules.peft.lora import LoRALinear, QATLoRALinear  # noqa: E402

out_file, stories = sys.argv[1], sys.argv[2]
out = {}
gen = torch.Generator().manual_seed(23)

# --- NF4 -------------------------------------------------------------------------------------
weights = {
    "normal_128x128": torch.randn(128, 128, generator=gen) * 0.02,
    "uniform_256x512": torch.rand(256, 512, generator=gen) * 2 - 1,
    "ties_64x256": torch.randint(-4, 5, (64, 256), generator=gen).float() / 4,  # exact midpoints
}
with open(stories, "rb") as f:  # llama2.c legacy: 7 int32 (dim, hidden, layers, heads, kv, vocab, seq), then fp32
    dim, _, _, _, _, vocab, _ = struct.unpack("7i", f.read(28))
    vocab = abs(vocab)
    weights["stories260k_embedding"] = torch.frombuffer(bytearray(f.read(4 * vocab * dim)),
                                                        dtype=torch.float32).view(vocab, dim).clone()
for name, w in weights.items():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        key = f"nf4.{name}.{str(dtype).split('.')[-1]}"
        t = w.to(dtype).contiguous()
        n = to_nf4(t)
        out.update({f"{key}.weight": t, f"{key}.quantized_data": n.quantized_data,
                    f"{key}.quantized_scalers": n.quantized_scalers,
                    f"{key}.quantization_factor": n.quantization_factor,
                    f"{key}.scaler_mean": n.scaler_mean.reshape(1), f"{key}.dequantized": n.get_original_weight()})

# --- QLoRA linear (TorchTune) ----------------------------------------------------------------
torch.set_default_dtype(torch.bfloat16)
layer = LoRALinear(256, 128, rank=8, alpha=16, quantize_base=True)
w = (torch.randn(128, 256, generator=gen) * 0.05).to(torch.bfloat16)
layer.weight = torch.nn.Parameter(to_nf4(w), requires_grad=False)
with torch.no_grad():
    layer.lora_b.weight.normal_(0, 0.05, generator=gen)
x = torch.randn(2, 5, 256, generator=gen).to(torch.bfloat16).requires_grad_(True)
grad_y = torch.randn(2, 5, 128, generator=gen).to(torch.bfloat16)
y = layer(x)
y.backward(grad_y)
layer.disabled = True
with torch.no_grad():
    y_disabled = layer(x)
out.update({"qlora.weight": w, "qlora.lora_a": layer.lora_a.weight.detach(), "qlora.lora_b": layer.lora_b.weight.detach(),
            "qlora.x": x.detach(), "qlora.grad_y": grad_y, "qlora.y": y.detach(), "qlora.y_disabled": y_disabled,
            "qlora.grad_x": x.grad, "qlora.grad_lora_a": layer.lora_a.weight.grad,
            "qlora.grad_lora_b": layer.lora_b.weight.grad})
torch.set_default_dtype(torch.float32)

# --- 8da4w QAT (torchao) ---------------------------------------------------------------------
for dtype in (torch.bfloat16, torch.float32):
    for group in (256, 32):
        key = f"qat.g{group}.{str(dtype).split('.')[-1]}"
        w = torch.randn(64, 512, generator=gen).to(dtype)
        w[3, :group] = 0  # an all-zero group: the scale is eps
        x = torch.randn(3, 7, 512, generator=gen) * 3
        x[0, 0] = 0  # an all-zero token
        x[1, 2] = x[1, 2].abs()  # a token without negatives
        x[2, 4, 7] = 40  # an outlier
        x = x.to(dtype).requires_grad_(True)
        model = torch.nn.Sequential(torch.nn.Linear(512, 64, bias=False))
        model[0].weight = torch.nn.Parameter(w.clone())
        quantizer = Int8DynActInt4WeightQATQuantizer(groupsize=group)
        model = quantizer.prepare(model)
        qlinear = model[0]
        grad_y = torch.randn(3, 7, 64, generator=gen).to(dtype)
        y = model(x)
        y.backward(grad_y)
        with torch.no_grad():
            x_fq = qlinear.activation_fake_quantizer(x)
            w_fq = qlinear.weight_fake_quantizer(qlinear.weight)
            qlinear.disable_fake_quant()
            y_disabled = model(x)
            qlinear.enable_fake_quant()
        out.update({f"{key}.weight": w, f"{key}.x": x.detach(), f"{key}.grad_y": grad_y, f"{key}.x_fq": x_fq,
                    f"{key}.weight_fq": w_fq, f"{key}.y": y.detach(), f"{key}.grad_x": x.grad,
                    f"{key}.grad_weight": qlinear.weight.grad, f"{key}.y_disabled": y_disabled})
        converted = quantizer.convert(model)[0]
        out.update({f"{key}.values": converted.weight, f"{key}.scales": converted.scales,
                    f"{key}.zeros": converted.zeros})

# --- QAT-LoRA linear (TorchTune) -------------------------------------------------------------
torch.set_default_dtype(torch.bfloat16)
layer = QATLoRALinear(512, 64, rank=4, alpha=8, activation_qat_config=_get_8da4w_activation_config(torch.float32),
                      weight_qat_config=_get_8da4w_weight_config(256, torch.float32))
w = torch.randn(64, 512, generator=gen).to(torch.bfloat16)
with torch.no_grad():
    layer.weight.copy_(w)
    layer.lora_b.weight.normal_(0, 0.05, generator=gen)
layer.weight.requires_grad_(False)
x = (torch.randn(2, 6, 512, generator=gen) * 2).to(torch.bfloat16).requires_grad_(True)
grad_y = torch.randn(2, 6, 64, generator=gen).to(torch.bfloat16)
y = layer(x)
y.backward(grad_y)
out.update({"qat_lora.weight": w, "qat_lora.lora_a": layer.lora_a.weight.detach(),
            "qat_lora.lora_b": layer.lora_b.weight.detach(), "qat_lora.x": x.detach(), "qat_lora.grad_y": grad_y,
            "qat_lora.y": y.detach(), "qat_lora.grad_x": x.grad, "qat_lora.grad_lora_a": layer.lora_a.weight.grad,
            "qat_lora.grad_lora_b": layer.lora_b.weight.grad})

torch.save({k: v.detach().contiguous() for k, v in out.items()}, out_file)
print(f"quant_oracles: {len(out)} tensors")
