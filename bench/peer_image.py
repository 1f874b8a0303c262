#!/usr/bin/env python3
"""The Python torch peer of `mgbench image`: the same workload written the way the paper's users
write it (Lawenda et al. 2025, sec. 3): torchvision MobileNetV2, torchvision.datasets.MNIST with a
Resize transform in a DataLoader, DistributedSampler, DistributedDataParallel (gloo on CPU, nccl
on GPUs, one GPU per rank by LOCAL_RANK). Precisions as mgbench's --precision: fp16/bf16 = the
model in that dtype (model.half()), amp-* = torch.autocast (+ torch.amp.GradScaler for amp-fp16).

By default the paper's input pipeline: each 28 px digit resized on the host (PIL, in the loader). Tuned
as a user who knows the GPU would write it: --workers 8 (the default with --device cuda),
--channels-last, --gpu-resize (uint8 digits cross to the device and are resized there, as mgbench
does), --compile (torch.compile of the model).

    torchrun --standalone --nproc_per_node 2 bench/peer_image.py --data DIR --image-size 64 ...
    python bench/peer_image.py --data DIR ...      # one process, without torchrun

Prints one JSON line on rank 0: {"img_per_s": ..., "train_s": ..., "samples": ...}, where
img_per_s = samples computed by all ranks / the slowest rank's training-loop time (as mgbench's
summary.samples_per_s), both after the first --warmup-steps steps.
"""
import argparse
import datetime
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset
from torchvision import transforms


def mnist_root(data_dir):
    """torchvision's MNIST wants <root>/MNIST/raw/<uncompressed files>."""
    root = tempfile.mkdtemp(prefix="peer-mnist-")
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        src = os.path.join(data_dir, name)
        if os.path.exists(src + ".gz"):
            with gzip.open(src + ".gz", "rb") as fin, open(os.path.join(raw, name), "wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copy(src, os.path.join(raw, name))
    return root


def resize_on_device(digits, size, dtype):
    """uint8 [B, 1, h, w] on the device -> normalised [B, 3, size, size] of dtype, as mgbench's device
    upscaling (data/transforms.cpp: normalise, then bilinear without corner alignment). torchvision's
    model wants 3 channels: the grey channel expanded (a view, no copy)."""
    x = (digits.to(dtype) / 255.0 - 0.1307) / 0.3081
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.expand(-1, 3, -1, -1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-train", type=int, default=2048)
    p.add_argument("--precision", choices=["fp64", "fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16"],
                   default="fp32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader worker processes (default: 8 with --device cuda, else 0)")
    p.add_argument("--channels-last", action="store_true", help="tuned peer: NHWC model and inputs")
    p.add_argument("--gpu-resize", action="store_true",
                   help="mnist: uint8 digits to the device, normalised and resized there (bilinear, as mgbench's "
                        "--upscale device), instead of torchvision's Resize on the host")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (its first steps compile: "
                                                          "leave them out with --warmup-steps)")
    p.add_argument("--dataset", choices=["mnist", "imagefolder"], default="mnist")
    p.add_argument("--model", choices=["mobilenet_v2", "resnet50"], default="mobilenet_v2")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="leave the first K steps (cuDNN autotuning, allocator) out of img_per_s, as mgbench's "
                        "--warmup-steps-excluded")
    a = p.parse_args()
    if a.gpu_resize and a.dataset != "mnist":
        p.error("--gpu-resize: mnist only (imagefolder's crops are drawn per file on the host)")

    cuda = a.device == "cuda"
    if a.workers is None:
        a.workers = 8 if cuda else 0
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    backend, timeout = "nccl" if cuda else "gloo", datetime.timedelta(minutes=5)
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group(backend, timeout=timeout)
    else:  # started alone: a group of one, through a file (no port to pick)
        store = os.path.join(tempfile.mkdtemp(prefix="peer-store-"), "store")
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    dtype = {"fp64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision, torch.float32)
    autocast_dtype = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(a.precision)
    scaler = torch.amp.GradScaler(a.device) if a.precision == "amp-fp16" else None

    root = mnist_root(a.data) if rank == 0 and a.dataset == "mnist" else None
    root_list = [root]
    dist.broadcast_object_list(root_list, src=0)
    if a.dataset == "imagefolder":  # --data DIR/train: JPEG / PNG files, ImageNet's training transforms
        transform = transforms.Compose([
            transforms.RandomResizedCrop(a.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])
        train = torchvision.datasets.ImageFolder(os.path.join(a.data, "train"), transform=transform)
    elif a.gpu_resize:  # batches of uint8 [B, 1, 28, 28]: 784 bytes a digit cross to the device
        mnist = torchvision.datasets.MNIST(root_list[0], train=True, download=False)
        train = TensorDataset(mnist.data.unsqueeze(1), mnist.targets)
        train.classes = mnist.classes
    else:
        transform = transforms.Compose([
            transforms.Grayscale(num_output_channels=3),
            transforms.Resize((a.image_size, a.image_size)),
            transforms.ToTensor(),
            transforms.Normalize((0.1307,) * 3, (0.3081,) * 3),
        ])
        train = torchvision.datasets.MNIST(root_list[0], train=True, download=False, transform=transform)
    classes = len(train.classes)  # mgbench's model: one output per class folder (MNIST: 10)
    train = Subset(train, range(min(a.limit_train, len(train))))
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=42)
    loader = DataLoader(train, batch_size=a.batch_size, sampler=sampler, num_workers=a.workers,
                        pin_memory=a.pin_memory and cuda)

    model = getattr(torchvision.models, a.model)(num_classes=classes)
    model = model.to(device, dtype)
    memory_format = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    model = DDP(model, device_ids=[device.index] if cuda else None)
    if a.compile:
        model = torch.compile(model)  # the DDP module compiled: TorchDynamo splits at its buckets
    # mgbench's defaults per model: the image recipe's (MobileNetV2), ResNet-50's from torchvision's reference.
    lr, weight_decay = {"mobilenet_v2": (0.05, 4e-5), "resnet50": (0.1, 1e-4)}[a.model]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()

    samples, train_s, step = 0, 0.0, 0
    warmup_samples, warmup_s = 0, 0.0  # at the end of step --warmup-steps
    model.train()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for images, labels in loader:
            images = images.to(device, non_blocking=a.pin_memory)
            images = resize_on_device(images, a.image_size, dtype) if a.gpu_resize else images.to(dtype)
            images = images.contiguous(memory_format=memory_format)
            labels = labels.to(device, non_blocking=a.pin_memory)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(a.device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = loss_fn(model(images), labels)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            loss.item()  # the step's end on the device too
            samples += images.shape[0]
            step += 1
            if step == a.warmup_steps:
                warmup_samples, warmup_s = samples, train_s + time.perf_counter() - start
        train_s += time.perf_counter() - start
    # On the process group's device: NCCL has no CPU tensors (the first H200 reading failed here).
    if step < a.warmup_steps:
        sys.exit(f"peer_image.py: --warmup-steps {a.warmup_steps}: the run has only {step} step(s)")
    samples, train_s = samples - warmup_samples, train_s - warmup_s
    totals = torch.tensor([float(samples), train_s], dtype=torch.float64, device=device)
    dist.all_reduce(totals[:1], op=dist.ReduceOp.SUM)
    slowest = torch.tensor([train_s], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"img_per_s": totals[0].item() / slowest.item(), "train_s": slowest.item(),
                          "samples": int(totals[0].item())}), flush=True)
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    # Skip interpreter teardown: destroying DDP's gloo process group can hang joining its threads
    # (seen with torch 2.11 on CPU), which would stall the benchmark after the numbers are out.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
