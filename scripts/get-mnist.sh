#!/usr/bin/env bash
# Finds or fetches MNIST (IDX, gzip) and prints its directory as the last line of stdout:
#   1. ../shared/data/mnist (MGBENCH_SHARED_MNIST) where it exists (the team's shared copy);
#   2. ~/.cache/mgbench/data/mnist (MGBENCH_DATA_CACHE) when its four files pass their checksums;
#   3. a download into that cache from torchvision's mirrors, each file checked against torchvision's md5;
#   4. without a network to those mirrors: Fashion-MNIST from Debian's package dataset-fashion-mnist
#      (same IDX format, 60,000 + 10,000 images of clothing; installed with apt-get if missing), said so
#      on stderr. Its files are recompressed by Debian (other md5s than upstream's); their IDX headers
#      are checked instead, the package itself by apt's signatures.
#   scripts/get-mnist.sh            -> prints e.g. /root/.cache/mgbench/data/mnist
#   scripts/get-mnist.sh --official -> steps 2-3 only (the official files or exit 1: scripts/get_test_data.py)
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
# torchvision.datasets.MNIST.resources (torchvision 0.26)
declare -A MD5=([train-images-idx3-ubyte.gz]=f68b3c2dcbeaaa9fbdd348bbdeb94873
  [train-labels-idx1-ubyte.gz]=d53e105ee54ea40749a09fcbcd1e9432
  [t10k-images-idx3-ubyte.gz]=9fb629c4189551a2d022fa330f9573f3
  [t10k-labels-idx1-ubyte.gz]=ec29112dd5afa0611ce80d1b7f02629c)
# torchvision's mirrors (MGBENCH_MNIST_MIRRORS: others, space-separated, each ending in /)
read -r -a MIRRORS <<<"${MGBENCH_MNIST_MIRRORS:-https://ossci-datasets.s3.amazonaws.com/mnist/ http://yann.lecun.com/exdb/mnist/}"
CACHE=${MGBENCH_DATA_CACHE:-$HOME/.cache/mgbench/data}/mnist
FASHION=/usr/share/datasets/fashion-mnist
SHARED_MNIST=${MGBENCH_SHARED_MNIST:-../shared/data/mnist}

have_all() { for f in "${FILES[@]}"; do [[ -s "$1/$f" ]] || return 1; done; }
verified() { have_all "$1" && for f in "${FILES[@]}"; do echo "${MD5[$f]}  $1/$f"; done | md5sum --quiet -c - >/dev/null 2>&1; }

OFFICIAL=0
[[ ${1:-} == --official ]] && OFFICIAL=1
if ((!OFFICIAL)) && have_all "$SHARED_MNIST"; then
  echo "get-mnist: using the shared copy $SHARED_MNIST" >&2
  realpath "$SHARED_MNIST"
  exit 0
fi
if verified "$CACHE"; then
  echo "get-mnist: using $CACHE (checksums verified)" >&2
  echo "$CACHE"
  exit 0
fi

mkdir -p "$CACHE"
fetched=1
for f in "${FILES[@]}"; do
  if [[ -s "$CACHE/$f" ]] && echo "${MD5[$f]}  $CACHE/$f" | md5sum --quiet -c - >/dev/null 2>&1; then continue; fi
  ok=0
  for mirror in "${MIRRORS[@]}"; do
    if curl -fsSL --connect-timeout 10 --max-time 600 -o "$CACHE/$f.part" "$mirror$f" 2>/dev/null; then
      if echo "${MD5[$f]}  $CACHE/$f.part" | md5sum --quiet -c - >/dev/null 2>&1; then
        mv "$CACHE/$f.part" "$CACHE/$f"
        ok=1
        break
      fi
      echo "get-mnist: $mirror$f: wrong md5 (expected ${MD5[$f]}): ignored" >&2
    fi
    rm -f "$CACHE/$f.part"
  done
  ((ok)) || { fetched=0; break; }
done
if ((fetched)) && verified "$CACHE"; then
  echo "get-mnist: downloaded MNIST into $CACHE (checksums verified)" >&2
  echo "$CACHE"
  exit 0
fi

if ((OFFICIAL)); then
  echo "get-mnist: MNIST could not be downloaded from ${MIRRORS[*]} (no network?)" >&2
  exit 1
fi
echo "get-mnist: MNIST could not be downloaded from ${MIRRORS[*]} (no network?):" \
  "falling back to Fashion-MNIST from Debian's package dataset-fashion-mnist" >&2
if ! have_all "$FASHION"; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null ||
    { echo "get-mnist: apt-get install dataset-fashion-mnist failed: no dataset for the demo" >&2; exit 1; }
fi
# IDX headers: magic 2051 (images, 28 x 28) / 2049 (labels) and the official counts.
check_header() {  # check_header FILE EXPECTED_HEX
  local got
  got=$(set +o pipefail; zcat "$1" | head -c 16 | od -An -tx1 | tr -d ' \n')
  [[ "$got" == "$2"* ]] || { echo "get-mnist: $1: IDX header $got, expected $2...: not Fashion-MNIST" >&2; exit 1; }
}
check_header "$FASHION/train-images-idx3-ubyte.gz" 000008030000ea600000001c0000001c
check_header "$FASHION/train-labels-idx1-ubyte.gz" 000008010000ea60
check_header "$FASHION/t10k-images-idx3-ubyte.gz" 00000803000027100000001c0000001c
check_header "$FASHION/t10k-labels-idx1-ubyte.gz" 0000080100002710
echo "$FASHION"
