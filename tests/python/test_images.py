"""Encoded-image datasets end to end: `mgbench data make-images` read back by torchvision's ImageFolder,
webdataset shards written by the webdataset package trained on by 2 ranks (whole shards per rank,
disjoint samples, the loss falling), ImageFolder training, and bad files named."""
import io
import os

import h5py
import numpy as np
import pytest

from conftest import mgbench

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

SIZE = 300  # natively sized files, as the second paper's scenario B; the model sees 32 px crops


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from conftest import MNIST
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    out = tmp_path_factory.mktemp("images") / "mnist300"
    proc = mgbench("data", "make-images", "--data", MNIST, "--out", out, "--image-size", SIZE, "--limit-train", 1200,
                   "--limit-test", 200, "--quality", 90, "--threads", 2, check=True)
    assert "1200 jpeg files of 300 x 300 px" in proc.stdout
    return out


def test_make_images_is_an_image_folder_torchvision_reads(folder):
    torchvision = pytest.importorskip("torchvision")
    train = torchvision.datasets.ImageFolder(str(folder / "train"))
    val = torchvision.datasets.ImageFolder(str(folder / "val"))
    assert train.classes == [str(d) for d in range(10)] == val.classes
    assert len(train) == 1200 and len(val) == 200
    image, label = train[0]
    assert image.size == (SIZE, SIZE) and image.mode == "RGB"
    assert label == 0  # the first file of class "0"
    # Files are named by their MNIST index: the first training digit is a 5.
    assert (folder / "train" / "5" / "000000.jpg").exists()
    # Made again into the same --out (fewer files, or PNG), the old files stayed in the dataset: refused.
    from conftest import MNIST
    again = mgbench("data", "make-images", "--data", MNIST, "--out", folder, "--image-size", 8, "--limit-train", 20,
                    "--limit-test", 20, "--format", "png")
    assert again.returncode == 2 and "already holds files" in again.stderr, again.stderr
    assert len(torchvision.datasets.ImageFolder(str(folder / "train"))) == 1200


def test_make_images_refuses_before_writing(tmp_path):
    from conftest import MNIST
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    # A JPEG quality for PNG files: refused (was ignored).
    png = mgbench("data", "make-images", "--data", MNIST, "--out", tmp_path / "png", "--image-size", 8, "--format",
                  "png", "--quality", 5)
    assert png.returncode == 2 and "--quality '5': only with --format jpeg" in png.stderr, png.stderr
    # A test split missing: nothing written (was: train/ written, then the rerun refused for it).
    partial = tmp_path / "mnist-train-only"
    partial.mkdir()
    for name in os.listdir(MNIST):
        if name.startswith("train-"):
            os.symlink(os.path.join(MNIST, name), partial / name)
    half = mgbench("data", "make-images", "--data", partial, "--out", tmp_path / "half", "--image-size", 8,
                   "--limit-train", 20)
    assert half.returncode == 1 and "t10k" in half.stderr, half.stderr
    assert not (tmp_path / "half" / "train").exists() or not any((tmp_path / "half" / "train").iterdir())


def write_shards(folder, split, out, maxcount):
    """The folder's split as webdataset shards, written by the webdataset package."""
    webdataset = pytest.importorskip("webdataset")
    torchvision = pytest.importorskip("torchvision")
    dataset = torchvision.datasets.ImageFolder(str(folder / split))
    out.mkdir(parents=True, exist_ok=True)
    with webdataset.ShardWriter(str(out / "shard-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for i, (path, label) in enumerate(dataset.samples):
            with open(path, "rb") as f:
                sink.write({"__key__": f"sample{i:06d}", "jpg": f.read(), "cls": label})
    return dataset


def run_record(path):
    """Each rank's recorded indices [epochs, samples], rank 0's epoch losses, the run's attributes."""
    with h5py.File(path) as f:
        (run,) = f["runs"].values()
        indices = {r: run[f"rank_{r}/indices"][:] for r in range(run.attrs["world_size"])}
        return indices, run["rank_0/epochs"][:]["loss_mean"], dict(run.attrs)


def test_webdataset_two_ranks_read_whole_shards(folder, tmp_path):
    shards = tmp_path / "shards"
    dataset = write_shards(folder, "train", shards / "train", maxcount=100)  # 12 shards of 100
    write_shards(folder, "val", shards / "val", maxcount=100)
    results = tmp_path / "wds.h5"
    mgbench("image", "--dataset", "webdataset", "--data", shards, "--image-size", 32, "--crop", "center",
            "--batch-size", 50, "--epochs", 3, "--record-indices", "--loader-threads", 2, "--threads", 1,
            "--device", "cpu", "--results", results, "--progress-interval", 1000, np=2, check=True)
    indices, losses, attrs = run_record(results)
    for epoch in range(3):
        seen = [set(indices[r][epoch].tolist()) for r in (0, 1)]
        assert not seen[0] & seen[1], "a sample on both ranks in one epoch"
        assert len(indices[0][epoch]) == len(indices[1][epoch]) == 600
        # Whole shards: the shards a rank's samples come from (index // 100) hold only its samples.
        shards_of = [{i // 100 for i in s} for s in seen]
        assert not shards_of[0] & shards_of[1]
        assert len(shards_of[0]) == len(shards_of[1]) == 6
    assert set(indices[0][0].tolist()) != set(indices[0][1].tolist()), "the same shards every epoch"
    assert losses[-1] < 0.7 * losses[0], losses
    assert attrs["num_classes"] == len(dataset.classes)


def test_image_folder_trains_and_labels_follow_the_folders(folder, tmp_path):
    results = tmp_path / "if.h5"
    mgbench("image", "--dataset", "imagefolder", "--data", folder, "--image-size", 32, "--crop", "center",
            "--batch-size", 50, "--epochs", 6, "--loader-threads", 2, "--threads", 1, "--device", "cpu",
            "--results", results, "--progress-interval", 1000, np=2, check=True)
    with h5py.File(results) as f:
        (run,) = f["runs"].values()
        assert run.attrs["train_samples"] == 1200 and run.attrs["num_classes"] == 10
        # Digits are learnable only when the labels are the folders' classes (92 % here; BatchNorm's
        # running statistics need the first epochs' 40 steps to settle).
        assert run["summary"][0]["test_accuracy"] > 0.5


def test_native_size_is_the_files_own(folder, tmp_path):
    """--image-size native: the model sees the files at their own 300 px (centre crop of a square file:
    no resize), recorded as the run's image size; MNIST's native size is 28."""
    results = tmp_path / "native.h5"
    proc = mgbench("image", "--dataset", "imagefolder", "--data", folder, "--image-size", "native", "--crop", "center",
                   "--limit-train", 40, "--limit-test", 20, "--batch-size", 10, "--epochs", 1, "--loader-threads", 2,
                   "--threads", 2, "--device", "cpu", "--results", results, "--progress-interval", 1000, check=True)
    assert "--image-size native: 300 px" in proc.stderr + proc.stdout
    from conftest import MNIST
    mgbench("image", "--data", MNIST, "--image-size", "native", "--limit-train", 64, "--limit-test", 32,
            "--batch-size", 32, "--epochs", 1, "--device", "cpu", "--results", results, "--progress-interval", 1000,
            check=True)
    with h5py.File(results) as f:
        folder_run, mnist_run = f["runs"].values()
        assert folder_run.attrs["image_size"] == 300 and mnist_run.attrs["image_size"] == 28
    proc = mgbench("image", "--data", MNIST, "--image-size", "0", "--device", "cpu", "--results", results)
    assert proc.returncode != 0 and "--image-size '0': expected >= 1" in proc.stderr


def test_bad_files_are_named(folder, tmp_path):
    bad = tmp_path / "bad"
    for split in ("train", "val"):
        for c in ("a", "b"):
            (bad / split / c).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(bad / split / c / "ok.png")
    good = io.BytesIO()
    Image.new("RGB", (64, 64), (9, 9, 9)).save(good, "JPEG")
    (bad / "train" / "b" / "cut.jpg").write_bytes(good.getvalue()[:300])
    proc = mgbench("image", "--dataset", "imagefolder", "--data", bad, "--image-size", 8, "--batch-size", 4,
                   "--epochs", 1, "--device", "cpu", "--results", tmp_path / "bad.h5", np=1)
    assert proc.returncode != 0
    assert "cut.jpg" in proc.stderr + proc.stdout
    assert "corrupt" in proc.stderr + proc.stdout and "JPEG" in proc.stderr + proc.stdout
    # --decode device without a GPU: refused at set-up, saying why.
    proc = mgbench("image", "--dataset", "imagefolder", "--data", bad, "--image-size", 8, "--device", "cpu",
                   "--decode", "device", "--results", tmp_path / "dev.h5", np=1)
    assert proc.returncode != 0 and "--decode device needs a GPU" in proc.stderr + proc.stdout
    # A format ImageFolder lists and mgbench does not decode: refused at set-up (was: at its first batch,
    # in the middle of an epoch), or with --skip-bad-images warned of and replaced.
    (bad / "train" / "b" / "cut.jpg").unlink()
    Image.new("RGB", (8, 8)).save(bad / "train" / "a" / "x.bmp")
    common = ["image", "--dataset", "imagefolder", "--data", bad, "--image-size", 8, "--batch-size", 4, "--epochs", 1,
              "--device", "cpu", "--results", tmp_path / "bmp.h5"]
    proc = mgbench(*common, np=1)
    first = bad / "train" / "a" / "x.bmp"
    expected = f"{bad / 'train'}: 1 of its 3 image files are not JPEG or PNG (the first: {first})"
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr[-2000:]
    assert "--skip-bad-images" in proc.stderr and "epoch 1/1" not in proc.stdout + proc.stderr
    proc = mgbench(*common, "--skip-bad-images", "true", np=1)
    assert proc.returncode == 0 and expected in proc.stderr, proc.stderr[-2000:]
    with h5py.File(tmp_path / "bmp.h5") as f:
        (run,) = f["runs"].values()
        assert run["rank_0/epochs"]["skipped_images"].sum() == 1
    # The decoder goes by a file's first bytes, not its name: a PNG named .tif is no bad file.
    (bad / "train" / "a" / "x.bmp").unlink()
    Image.new("RGB", (8, 8)).save(bad / "train" / "a" / "png.tif", "PNG")
    proc = mgbench(*common[:-1], tmp_path / "tif.h5", np=1)
    assert proc.returncode == 0 and "not JPEG or PNG" not in proc.stderr, proc.stderr[-2000:]
    with h5py.File(tmp_path / "tif.h5") as f:
        (run,) = f["runs"].values()
        assert run["rank_0/epochs"]["skipped_images"].sum() == 0
    (bad / "val" / "b" / "ok.png").unlink()  # an empty class folder
    proc = mgbench("image", "--dataset", "imagefolder", "--data", bad, "--image-size", 8, "--device", "cpu",
                   "--results", tmp_path / "bad2.h5", np=1)
    assert proc.returncode != 0 and "holds no image file" in proc.stderr + proc.stdout
    (bad / "wds" / "train").mkdir(parents=True)
    (bad / "wds" / "train" / "x.tar").write_bytes(b"not a tar archive" * 64)
    proc = mgbench("image", "--dataset", "webdataset", "--data", bad / "wds", "--image-size", 8, "--device", "cpu",
                   "--results", tmp_path / "bad3.h5", np=1)
    assert proc.returncode != 0 and "x.tar" in proc.stderr + proc.stdout and "checksum" in proc.stderr + proc.stdout


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """scikit-image's real photos and scans (JPEG and PNG; RGB, RGBA, palette, greyscale; 100 px to 2000 px
    a side) as an ImageFolder of two classes by their colour mode, every third file in val/."""
    import shutil
    import sys
    source = os.path.join(sys.prefix, "skimage-site", "skimage", "data")
    files = sorted(f for f in os.listdir(source) if f.endswith((".jpg", ".png"))) if os.path.isdir(source) else []
    if len(files) < 12:
        pytest.skip(f"no scikit-image photos at {source} (scripts/install-deps.sh)")
    root = tmp_path_factory.mktemp("photos")
    for i, name in enumerate(files):
        with Image.open(os.path.join(source, name)) as image:
            label = "grey" if image.mode in ("1", "L", "LA", "I", "I;16") else "colour"
        out = root / ("val" if i % 3 == 2 else "train") / label
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(source, name), out / name)
    return root


def test_real_photos_train_resnet50_at_300_px_as_folders_and_shards(photos, tmp_path):
    # The command on real files: 2 ranks, ResNet-50, RandomResizedCrop to 300 px, each rank its
    # own samples, from an ImageFolder and from webdataset shards of the same files.
    torchvision = pytest.importorskip("torchvision")
    webdataset = pytest.importorskip("webdataset")
    shards = tmp_path / "shards"
    for split in ("train", "val"):
        (shards / split).mkdir(parents=True)
        folder = torchvision.datasets.ImageFolder(str(photos / split))
        with webdataset.ShardWriter(str(shards / split / "shard-%06d.tar"), maxcount=4, verbose=0) as sink:
            for i, (path, label) in enumerate(folder.samples):
                with open(path, "rb") as f:
                    sink.write({"__key__": f"photo{i:04d}", path.rsplit(".", 1)[1]: f.read(), "cls": label})
    train = len(torchvision.datasets.ImageFolder(str(photos / "train")))
    for dataset, data in (("imagefolder", photos), ("webdataset", shards)):
        results = tmp_path / f"{dataset}.h5"
        mgbench("image", "--dataset", dataset, "--data", data, "--model", "resnet50", "--image-size", 300,
                "--batch-size", 2, "--epochs", 1, "--record-indices", "--loader-threads", 1, "--threads", 1,
                "--device", "cpu", "--results", results, "--progress-interval", 1000, np=2, check=True)
        indices, losses, attrs = run_record(results)
        assert attrs["train_samples"] == train and attrs["num_classes"] == 2, (dataset, attrs)
        seen = [set(indices[r][0].tolist()) for r in (0, 1)]
        assert len(indices[0][0]) == len(indices[1][0]) == (train + 1) // 2, dataset
        if dataset == "imagefolder":
            assert not seen[0] & seen[1]
        else:  # 5 shards over 2 ranks: DistributedSampler pads with one shard again, the only overlap
            assert len({i // 4 for i in seen[0] & seen[1]}) <= 1, seen
        assert np.isfinite(losses).all(), (dataset, losses)
        with h5py.File(results) as f:
            (run,) = f["runs"].values()
            status = run["status"][()].ravel()[0]
            assert status in (b"completed", "completed") and run["rank_0/epochs"][0]["skipped_images"] == 0


def test_a_remainder_batch_batchnorm_cannot_train_on_is_refused_before_training(tmp_path):
    """One rule for the last batch of an epoch (issue 50): where BatchNorm would normalise one value per
    channel -- one image whose last feature map is 1 x 1, i.e. images of at most 32 px -- the run is
    refused before training, naming the fixes. 17 images on 2 ranks at batch 4 leave each rank 4, 4
    and 1 (DistributedSampler pads 17 to 18); LibTorch ended that job with "Expected more than 1 value
    per channel" and a backtrace. A remainder of 2 (20 images) trains, as do --drop-last true (8 per
    rank), --freeze-batchnorm true (running statistics) and 64 px images (a 2 x 2 map)."""
    from conftest import MNIST
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")

    def run(limit, *extra, size=32):
        return mgbench("image", "--data", MNIST, "--image-size", size, "--width-mult", 0.25, "--threads", 1,
                       "--progress-interval", 1000, "--device", "cpu", "--limit-train", limit, "--limit-test", 16,
                       "--epochs", 1, "--batch-size", 4, "--results", tmp_path / f"r{limit}-{size}-{len(extra)}.h5",
                       *extra, np=2)

    refused = run(17)
    assert refused.returncode != 0, refused.stderr[-3000:]
    assert ("--batch-size 4: rank 0 computes a batch of 1 sample(s) at the end of each epoch (17 samples over 2 "
            "rank(s)), and this training needs at least 2 per rank (BatchNorm normalises 32 px images' last 1 x 1 "
            "feature map") in refused.stderr, refused.stderr[-3000:]
    assert "--drop-last true" in refused.stderr and "--freeze-batchnorm true" in refused.stderr
    assert "Expected more than 1 value" not in refused.stderr
    for limit, extra, size in ((20, (), 32), (17, ("--drop-last", "true"), 32), (17, ("--freeze-batchnorm", "true"), 32),
                               (17, (), 64)):
        trained = run(limit, *extra, size=size)
        assert trained.returncode == 0, (limit, extra, size, trained.stderr[-3000:])


def test_a_truncated_shard_is_refused_naming_it_and_the_byte(folder, tmp_path):
    """A webdataset shard cut short where Python's tarfile (and so webdataset) reads on silently -- at
    a member's boundary, or inside the next header -- is refused naming the shard and the byte, not
    trained on with the members before the cut (issue 50)."""
    import tarfile
    shards = tmp_path / "wds"
    write_shards(folder, "val", shards / "train", maxcount=100)  # 2 shards of 100 samples
    write_shards(folder, "val", shards / "val", maxcount=100)
    shard = shards / "train" / "shard-000001.tar"
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    boundary = members[10].offset  # the header (pax) of the 11th member
    data = shard.read_bytes()
    for cut, what in ((boundary, f"no end-of-archive block at byte {boundary}"),
                      (boundary + 100, f"a header cut off at byte {boundary}")):
        shard.write_bytes(data[:cut])
        with tarfile.open(shard) as tar:  # what tarfile makes of it: the members before the cut, no error
            assert len(tar.getmembers()) == 10
        proc = mgbench("image", "--dataset", "webdataset", "--data", shards, "--image-size", 32, "--crop", "center",
                       "--batch-size", 50, "--epochs", 1, "--threads", 1, "--device", "cpu",
                       "--results", tmp_path / "cut.h5", np=1)
        assert proc.returncode != 0, proc.stderr[-2000:]
        assert f"{shard}: truncated: {what}" in proc.stderr + proc.stdout, proc.stderr[-2000:]
