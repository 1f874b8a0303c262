#!/usr/bin/env python3
"""The Python peer of `mgbench data read-images`: torchvision's ImageFolder with the transforms users
write for ImageNet-style training (RandomResizedCrop + RandomHorizontalFlip, or Resize + CenterCrop)
ending in a uint8 tensor (PILToTensor: mgbench normalises on the device, so neither side converts
to float here), batched by a DataLoader with num_workers worker processes (mgbench: --loader-threads
threads), shuffled.

    peer_loader.py --data DIR --image-size 224 --batch-size 64 --workers 4 --batches 20

Prints one JSON line: {"img_per_s", "images", "seconds", "workers"}, timed from the second batch
(the first pays the workers' start) to the last, as mgbench's.
"""
import argparse
import json
import os
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--crop", choices=["random", "center"], default="random")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batches", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)
    crop = ([transforms.RandomResizedCrop(a.image_size), transforms.RandomHorizontalFlip()] if a.crop == "random"
            else [transforms.Resize(a.image_size), transforms.CenterCrop(a.image_size)])
    dataset = torchvision.datasets.ImageFolder(os.path.join(a.data, "train"),
                                               transform=transforms.Compose(crop + [transforms.PILToTensor()]))
    loader = DataLoader(dataset, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        persistent_workers=a.workers > 0, prefetch_factor=2 if a.workers > 0 else None)
    done, images, start = 0, 0, None
    while done <= a.batches:
        for x, _ in loader:
            if done > a.batches:
                break
            if done == 1:
                start = time.perf_counter()
            if done >= 1:
                images += x.shape[0]
            done += 1
    seconds = time.perf_counter() - start
    print(json.dumps({"img_per_s": images / seconds, "images": images, "seconds": seconds, "workers": a.workers}))


if __name__ == "__main__":
    main()
