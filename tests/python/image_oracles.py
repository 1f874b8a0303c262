#!/usr/bin/env python3
"""Image decoding and transform references for mgbench's unit tests (test_images.cpp), from PIL and
torchvision. Called by make_oracles.py; alone:

    image_oracles.py OUT_DIR [PHOTO_DIR]

Writes OUT_DIR/images/:
  manifest.json   one entry per file: {"file", "width", "height", "rgb"} for an image (the rgb file holds
                  PIL's Image.open(f).convert("RGB") pixels, uint8 [H, W, 3]) or {"file", "error"} for a
                  file mgbench must refuse (the error names what is wrong: a substring of the message)
  *.jpg, *.png    real photos (scikit-image's data files: PHOTO_DIR, default the skimage-site folder
                  install-deps.sh fills beside the venv) and generated files: greyscale, CMYK,
                  progressive and 4:4:4 JPEGs; palette + transparency, 16-bit, grey + alpha PNGs; truncated, empty and non-image files
  folder/, folder.json  an ImageFolder tree (nested and linked folders, mixed-case extensions, files that
                  are not images) and torchvision.datasets.ImageFolder's classes and samples of it
  members_*.tar, tar_members.json  tar archives in pax, GNU and ustar formats (long names) and the
                  regular members Python's tarfile lists: name, data offset, size
  transforms.json torchvision's RandomResizedCrop.get_params + RandomHorizontalFlip draws after
                  torch.manual_seed(seed), and v2 resize / center_crop output checksums
  resize_*.bin    uint8 [3, h, w] outputs of torchvision.transforms.v2.functional.resize (antialias) for
                  the unit test to compare bitwise
"""
import io
import json
import os
import shutil
import sys
import tarfile
import zlib

import numpy as np
import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.v2 import functional as F

out = os.path.join(sys.argv[1], "images")
photos = sys.argv[2] if len(sys.argv) > 2 else os.path.join(sys.prefix, "skimage-site", "skimage", "data")
os.makedirs(out, exist_ok=True)
manifest = []


def image_entry(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    rgb.tofile(os.path.join(out, name + ".rgb"))
    manifest.append({"file": name, "width": rgb.shape[1], "height": rgb.shape[0], "rgb": name + ".rgb"})


def bad_entry(name, data, error):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
    manifest.append({"file": name, "error": error})


def encoded(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


# Real photos (JPEG and PNG), where scikit-image's data files are installed.
for name in ("rocket.jpg", "hubble_deep_field.jpg", "retina.jpg", "chelsea.png", "coffee.png", "camera.png",
             "logo.png"):
    path = os.path.join(photos, name)
    if os.path.isfile(path):
        image_entry("photo_" + name, open(path, "rb").read())
    else:
        print(f"image_oracles: {path} not found (install-deps.sh puts scikit-image's data there); photo left out")

# Generated: a smooth colour field with detail, odd sizes (partial MCUs).
g = torch.Generator().manual_seed(7)
yy, xx = np.mgrid[0:77, 0:131]
base = np.stack([(xx * 2) % 256, (yy * 3) % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)
base = np.clip(base.astype(np.int32) + torch.randint(-20, 21, base.shape, generator=g).numpy(), 0, 255).astype(np.uint8)
rgb_img = Image.fromarray(base, "RGB")
image_entry("gen_420_q90.jpg", encoded(rgb_img, "JPEG", quality=90))
image_entry("gen_444_q95.jpg", encoded(rgb_img, "JPEG", quality=95, subsampling=0))
image_entry("gen_progressive.jpg", encoded(rgb_img, "JPEG", quality=85, progressive=True))
image_entry("gen_grey.jpg", encoded(rgb_img.convert("L"), "JPEG", quality=90))
image_entry("gen_cmyk.jpg", encoded(rgb_img.convert("CMYK"), "JPEG", quality=90))
image_entry("gen_rgb.png", encoded(rgb_img, "PNG"))
image_entry("gen_grey.png", encoded(rgb_img.convert("L"), "PNG"))
image_entry("gen_grey_alpha.png", encoded(rgb_img.convert("LA"), "PNG"))
image_entry("gen_rgba.png", encoded(rgb_img.convert("RGBA"), "PNG"))
pal = rgb_img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
image_entry("gen_palette_trns.png", encoded(pal, "PNG", transparency=3))
# 16-bit RGB: PIL reads it as RGB by the high byte (rawmode RGB;16B), as mgbench does.
rgb16 = (base.astype(np.uint16) * 257 + 100).astype(">u2")


def chunk(tag, body):
    return len(body).to_bytes(4, "big") + tag + body + zlib.crc32(tag + body).to_bytes(4, "big")


rows = b"".join(b"\0" + rgb16[r].tobytes() for r in range(rgb16.shape[0]))
ihdr = rgb16.shape[1].to_bytes(4, "big") + rgb16.shape[0].to_bytes(4, "big") + bytes([16, 2, 0, 0, 0])
data16 = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
image_entry("gen_rgb16.png", data16)

# Files to refuse, each with what the message must say.
jpeg = encoded(rgb_img, "JPEG", quality=90)
png = encoded(rgb_img, "PNG")
bad_entry("bad_empty.jpg", b"", "empty file")
bad_entry("bad_text.jpg", b"label,path\n3,x.jpg\n", "neither a JPEG nor a PNG")
bad_entry("bad_truncated.jpg", jpeg[: len(jpeg) // 2], "truncated or corrupt JPEG")
bad_entry("bad_truncated.png", png[: len(png) // 2], "PNG")
bad_entry("bad_header.jpg", jpeg[:20], "JPEG")
bad_entry("bad_crc.png", png[:40] + bytes([png[40] ^ 0xFF]) + png[41:], "PNG")


# --- an ImageFolder tree and torchvision's samples of it ------------------------------------------
# Class names and files whose byte order differs from a naive listing: upper case before lower, a
# nested folder, a symbolic link to a folder, extensions in other cases, files that are no image.
folder = os.path.join(out, "folder")
shutil.rmtree(folder, ignore_errors=True)
tiny = encoded(Image.new("RGB", (4, 4), (200, 10, 10)), "PNG")
layout = ["cat/b.png", "cat/A.PNG", "cat/sub/z.jpg", "cat/sub/a.jpeg", "Dog/x.png", "dog_2/1.webp", "dog_2/0.png",
          "dog_2/notes.txt", "eel/deep/er/one.png", "eel/two.Png"]
for rel in layout:
    os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
    with open(os.path.join(folder, rel), "wb") as f:
        f.write(b"RIFF\x1a\x00\x00\x00WEBPVP8 " if rel.endswith(".webp") else tiny)  # a WebP header: refused
os.symlink(os.path.join(folder, "cat", "sub"), os.path.join(folder, "eel", "linked"))
tv = ImageFolder(folder)
with open(os.path.join(out, "folder.json"), "w") as f:
    json.dump({"classes": tv.classes, "samples": [[os.path.relpath(p, folder), c] for p, c in tv.samples]}, f, indent=1)

# --- tar archives: members as Python's tarfile lists them ---------------------------------------
archives = []
for fmt_name, fmt in (("pax", tarfile.PAX_FORMAT), ("gnu", tarfile.GNU_FORMAT), ("ustar", tarfile.USTAR_FORMAT)):
    path = os.path.join(out, f"members_{fmt_name}.tar")
    with tarfile.open(path, "w", format=fmt) as tar:
        names = ["a.jpg", "a.cls", "dir/b.png", "x" * 40 + "/" + "y" * 90 + ".cls", "empty.txt"]
        if fmt != tarfile.USTAR_FORMAT:
            names.append("long/" + "z" * 150 + ".jpg")  # past ustar's 100 + 155: pax path / GNU 'L'
        info = tarfile.TarInfo("adir")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for k, name in enumerate(names):
            data = bytes(range(256)) * k + b"end" if name != "empty.txt" else b""
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        members = [[m.name, m.offset_data, m.size] for m in tar.getmembers() if m.isfile()]
    archives.append({"file": os.path.basename(path), "members": members})
with open(os.path.join(out, "tar_members.json"), "w") as f:
    json.dump(archives, f, indent=1)


def write_tar(path, members):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# webdataset shards with what webdataset's base_plus_ext leaves out (macOS's "._" files, ".DS_Store"),
# a dotted folder, a .cls with white space; and shards to refuse.
small_jpeg = encoded(Image.new("RGB", (6, 5), (1, 2, 3)), "JPEG")
shutil.rmtree(os.path.join(out, "wds"), ignore_errors=True)
write_tar(os.path.join(out, "wds", "good", "train", "a-000000.tar"),
          [("._k0.jpg", b"\0\5\26\7"), (".DS_Store", b"x"), ("k0.jpg", small_jpeg), ("k0.cls", b" 3\n"),
           ("dir.x/k1.png", tiny), ("dir.x/k1.cls", b"1")])
write_tar(os.path.join(out, "wds", "huge_class", "train", "a-000000.tar"),
          [("k.jpg", small_jpeg), ("k.cls", b"999999999")])
write_tar(os.path.join(out, "wds", "no_cls", "train", "a-000000.tar"), [("k.jpg", small_jpeg), ("k.txt", b"3")])
write_tar(os.path.join(out, "wds", "two_images", "train", "a-000000.tar"),
          [("k.jpg", small_jpeg), ("k.png", tiny), ("k.cls", b"0")])
# A JPEG libjpeg warns about but PIL decodes (JFIF revision 2.01): decoded, not refused.
jfif = bytearray(encoded(rgb_img, "JPEG", quality=90))
assert jfif[6:11] == b"JFIF\0"
jfif[11] = 2
image_entry("gen_jfif_revision2.jpg", bytes(jfif))

# --- transforms -------------------------------------------------------------------------------
crops = []
for seed in range(40):
    height, width = [(77, 131), (500, 375), (300, 300), (32, 900), (1000, 20)][seed % 5]
    torch.manual_seed(seed)
    # torchvision's procedure (transforms.RandomResizedCrop.get_params), then the flip draw
    # (RandomHorizontalFlip: torch.rand(1) < p), as Compose([RandomResizedCrop, RandomHorizontalFlip]).
    i, j, h, w = RandomResizedCrop.get_params(torch.empty(3, height, width), scale=(0.08, 1.0),
                                              ratio=(3.0 / 4.0, 4.0 / 3.0))
    flip = bool(torch.rand(1) < 0.5)
    crops.append({"seed": seed, "height": height, "width": width, "top": i, "left": j, "crop_height": h,
                  "crop_width": w, "flip": flip})

resizes = []
src = torch.from_numpy(base).permute(2, 0, 1).contiguous()  # [3, 77, 131]
for k, (h, w) in enumerate([(224, 224), (40, 60), (77, 131), (300, 500), (13, 200)]):
    r = F.resize(src, [h, w], antialias=True)
    r.numpy().tofile(os.path.join(out, f"resize_{k}.bin"))
    resizes.append({"file": f"resize_{k}.bin", "height": h, "width": w})
# Resize of the shorter side to 64, then CenterCrop(64) (the evaluation transform).
short = F.center_crop(F.resize(src, 64, antialias=True), [64, 64])
short.numpy().tofile(os.path.join(out, "resize_short_center.bin"))

with open(os.path.join(out, "transforms.json"), "w") as f:
    json.dump({"crops": crops, "resizes": resizes, "source": "gen_rgb.png",
               "short_center": {"file": "resize_short_center.bin", "size": 64}}, f, indent=1)
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
print(f"image_oracles: {len(manifest)} files, {len(crops)} crop draws, {len(resizes)} resizes in {out}")
