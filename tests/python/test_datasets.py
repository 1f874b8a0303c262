"""`mgbench data stats --dump`: templates, masks and truncation equal TorchTune 0.6.1's on real rows
of every dataset kind (../shared/data/text), plus bad-input errors."""
import json
import os
import subprocess
import sys
import types

import pytest

from conftest import BIN

SHARED = os.environ.get("MGBENCH_SHARED_DATA", os.path.join(os.path.dirname(__file__), "../../../shared/data"))
TOKENIZER = os.path.join(SHARED, "llama3", "tokenizer.model")
TEXT = os.path.join(SHARED, "text")
ROWS = 40
IGNORE = -100


def torchtune():
    """TorchTune's message transforms and tokenizer, from the folder scripts/install-deps.sh puts
    them in (beside the venv: its torchao would clash with peft's); HF `datasets` (imported by
    torchtune.data but not used by these pieces) is stubbed when absent."""
    site = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "torchtune-site")
    if os.path.isdir(site) and site not in sys.path:
        sys.path.insert(0, site)
    try:
        import datasets  # noqa: F401
    except ImportError:
        for name in ("datasets", "datasets.distributed"):
            m = types.ModuleType(name)
            m.load_dataset, m.Dataset, m.split_dataset_by_node = None, object, None
            sys.modules[name] = m
        sys.modules["datasets"].distributed = sys.modules["datasets.distributed"]
    return pytest.importorskip("torchtune")


def dump(kind, path, *extra):
    proc = subprocess.run([BIN, "data", "stats", "--dataset", kind, "--data", path, "--tokenizer", TOKENIZER,
                           "--dump", str(ROWS), *extra], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(line) for line in proc.stdout.decode().splitlines()]


def rows(path):
    if path.endswith(".csv"):
        import csv
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))[:ROWS]
    with open(path, encoding="utf-8") as f:
        return json.load(f)[:ROWS]


CASES = {
    "alpaca": ("alpaca/alpaca_cleaned_first5k.json", None, None),
    "grammar": ("grammar/c4_200m_first1k.csv", {"input": "input", "output": "target"},
                "torchtune.data.GrammarErrorCorrectionTemplate"),
    "samsum": ("samsum/samsum_validation_818.json", {"input": "dialogue", "output": "summary"},
               "torchtune.data.SummarizeTemplate"),
    "slimorca": ("slimorca/orca_style_80_from_dpo_en_demo.json", None, None),
}


@pytest.mark.parametrize("max_seq_len", [None, 64])
@pytest.mark.parametrize("train_on_input", [False, True])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_samples_equal_torchtune(kind, train_on_input, max_seq_len):
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    torchtune()
    from torchtune.data import AlpacaToMessages, InputOutputToMessages, ShareGPTToMessages
    from torchtune.models.llama3 import llama3_tokenizer
    rel, column_map, template = CASES[kind]
    path = os.path.join(TEXT, rel)
    tok = llama3_tokenizer(TOKENIZER, max_seq_len=max_seq_len, prompt_template=template)
    if kind == "alpaca":
        transform = AlpacaToMessages(train_on_input=train_on_input)
    elif kind == "slimorca":
        transform = ShareGPTToMessages(train_on_input=train_on_input)
    else:
        transform = InputOutputToMessages(train_on_input=train_on_input, column_map=column_map)
    extra = (["--train-on-input"] if train_on_input else []) + (["--max-seq-len", str(max_seq_len)] if max_seq_len else [])
    ours = dump(kind, path, *extra)
    source = rows(path)
    assert len(ours) == len(source) == ROWS
    for i, (row, sample) in enumerate(zip(source, ours)):
        out = tok(transform(dict(row)))
        labels = [IGNORE if m else t for t, m in zip(out["tokens"], out["mask"])]
        assert sample["tokens"] == out["tokens"], (kind, i)
        assert sample["labels"] == labels, (kind, i)


def hh_turns(transcript):
    """An HH-RLHF transcript as [{role, content}] (the turns after each Human / Assistant marker)."""
    import re
    parts = re.split(r"\n\n(Human|Assistant): ", transcript)
    assert parts[0] == "", transcript[:40]
    return [{"role": "user" if who == "Human" else "assistant", "content": text}
            for who, text in zip(parts[1::2], parts[2::2])]


def sharegpt_turn(turn):
    return {"role": {"system": "system", "human": "user", "gpt": "assistant"}[turn["from"]], "content": turn["value"]}


PREFERENCE = {
    "stack_exchange_paired": "dpo/stack_exchange_paired_tiny_torchtune.json",
    "hh_rlhf": "dpo/hh_rlhf_harmless_base_test.jsonl.gz",
    "preference": "dpo/dpo_en_demo_llamafactory.json",
}


def preference_rows(path, n):
    import gzip
    if path.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(next(f)) for _ in range(n)]
    with open(path, encoding="utf-8") as f:
        return json.load(f)[:n]


@pytest.mark.parametrize("max_seq_len", [None, 96])
@pytest.mark.parametrize("train_on_input", [False, True])
@pytest.mark.parametrize("kind", sorted(PREFERENCE))
def test_preference_samples_equal_torchtune(kind, train_on_input, max_seq_len):
    """Chosen and rejected, tokens and labels, equal TorchTune 0.6.1's PreferenceDataset._prepare_sample
    with its StackExchangePairedToMessages / ChosenRejectedToMessages transforms (the HH transcripts and
    the ShareGPT rows turned into its {role, content} lists first)."""
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    torchtune()
    from torchtune.data import ChosenRejectedToMessages
    from torchtune.datasets import PreferenceDataset
    from torchtune.datasets._stack_exchange_paired import StackExchangePairedToMessages
    from torchtune.models.llama3 import llama3_tokenizer
    path = os.path.join(TEXT, PREFERENCE[kind])
    n = 25
    extra = (["--train-on-input"] if train_on_input else []) + (["--max-seq-len", str(max_seq_len)] if max_seq_len else [])
    proc = subprocess.run([BIN, "data", "stats", "--dataset", kind, "--data", path, "--tokenizer", TOKENIZER,
                           "--dump", str(n), *extra], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    ours = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    dataset = PreferenceDataset.__new__(PreferenceDataset)  # its sample preparation, without HF `datasets`
    dataset._tokenizer = llama3_tokenizer(TOKENIZER, max_seq_len=max_seq_len)
    if kind == "stack_exchange_paired":
        dataset._message_transform = StackExchangePairedToMessages(
            train_on_input=train_on_input,
            column_map={"prompt": "question", "chosen": "response_j", "rejected": "response_k"})
    else:
        dataset._message_transform = ChosenRejectedToMessages(train_on_input=train_on_input)
    rows = preference_rows(path, n)
    assert len(ours) == len(rows) == n
    for i, (row, sample) in enumerate(zip(rows, ours)):
        if kind == "hh_rlhf":
            row = {"chosen": hh_turns(row["chosen"]), "rejected": hh_turns(row["rejected"])}
        elif kind == "preference":
            prompt = [sharegpt_turn(t) for t in row["conversations"]]
            row = {"chosen": prompt + [sharegpt_turn(row["chosen"])],
                   "rejected": [dict(m) for m in prompt] + [sharegpt_turn(row["rejected"])]}
        expected = dataset._prepare_sample(row)
        for side in ("chosen", "rejected"):
            assert sample[f"{side}_tokens"] == expected[f"{side}_input_ids"], (kind, i, side)
            assert sample[f"{side}_labels"] == [int(x) for x in expected[f"{side}_labels"]], (kind, i, side)


def test_bad_preference_rows_name_file_row_and_field(tmp_path):
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    cases = [
        ("stack_exchange_paired", [{"question": "q", "response_j": "a"}], b'"response_k"'),
        ("hh_rlhf", [{"chosen": "Human: no leading break", "rejected": "\n\nHuman: x\n\nAssistant: y"}],
         b'"chosen"'),
        ("hh_rlhf", [{"chosen": "\n\nHuman: x\n\nAssistant: y", "rejected": "\n\nHuman: only a question"}],
         b"ending with an Assistant turn"),
        ("preference", [{"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "a"}}],
         b'"rejected"'),
        ("preference", [{"conversations": [{"from": "bot", "value": "q"}], "chosen": {"from": "gpt", "value": "a"},
                         "rejected": {"from": "gpt", "value": "b"}}], b'"bot"'),
        # An answer that is the user's turn: masked out of the loss, it trained nothing (was accepted).
        ("preference", [{"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "human", "value": "a"},
                         "rejected": {"from": "gpt", "value": "b"}}], b'field "chosen" is a user turn'),
    ]
    for kind, rows, needle in cases:
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(rows), encoding="utf-8")
        proc = run_data(path, kind)
        assert proc.returncode == 1 and f"{kind}.json' row 1".encode() in proc.stderr and needle in proc.stderr, \
            proc.stderr


def test_conversations_torchtune_refuses_are_refused_naming_the_turn(tmp_path):
    """TorchTune's SFTDataset runs validate_messages on every row; slimorca rows it refuses were trained
    by mgbench (a user turn answered by nothing, two answers in a row). Each case: TorchTune raises, and
    mgbench refuses naming the file, the row and the turn; a valid row passes both."""
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    torchtune()
    from torchtune.data import ShareGPTToMessages, validate_messages
    turn = {"system": {"from": "system", "value": "s"}, "human": {"from": "human", "value": "q"},
            "gpt": {"from": "gpt", "value": "a"}}
    cases = [(["human"], "1 message(s)"), (["gpt", "human"], "turn 1: an assistant turn"),
             (["human", "human", "gpt"], "turns 1 and 2: two user turns"),
             (["human", "gpt", "gpt"], "turn 3: an assistant turn"),
             (["human", "system", "gpt"], "turn 2: a system turn"),
             (["system", "human", "gpt", "human", "gpt"], None)]
    for roles, needle in cases:
        row = {"conversations": [turn[r] for r in roles]}
        try:
            validate_messages(ShareGPTToMessages(train_on_input=False)(row)["messages"])
            torchtune_refuses = False
        except ValueError:
            torchtune_refuses = True
        assert torchtune_refuses == (needle is not None), roles
        path = tmp_path / "orca.json"
        path.write_text(json.dumps([{"conversations": [turn["human"], turn["gpt"]]}, row]))
        proc = run_data(path, "slimorca")
        if needle is None:
            assert proc.returncode == 0, proc.stderr
        else:
            assert proc.returncode == 1 and b"orca.json' row 2" in proc.stderr and needle.encode() in proc.stderr, \
                (roles, proc.stderr)


def test_text_kind_equals_torchtune_text_completion(tmp_path):
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    torchtune()
    from torchtune.data._utils import truncate
    from torchtune.models.llama3 import llama3_tokenizer
    texts = [r["output"] for r in rows(os.path.join(TEXT, "alpaca/alpaca_cleaned_first5k.json"))]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    for max_seq_len in (None, 32):
        tok = llama3_tokenizer(TOKENIZER, max_seq_len=max_seq_len)
        ours = dump("text", str(path), *(["--max-seq-len", str(max_seq_len)] if max_seq_len else []))
        for text, sample in zip(texts, ours):
            tokens = tok.encode(text, add_bos=True, add_eos=True)
            if max_seq_len:
                tokens = truncate(tokens, max_seq_len - 1)  # TorchTune's TextCompletionDataset
            assert sample["tokens"] == tokens and sample["labels"] == tokens


def run_data(path, kind="alpaca"):
    return subprocess.run([BIN, "data", "stats", "--dataset", kind, "--data", str(path), "--tokenizer", TOKENIZER],
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("kind, rel, max_seq_len", [("grammar", "grammar/c4_200m_first1k.csv", 48),
                                                   ("stack_exchange_paired", PREFERENCE["stack_exchange_paired"], 256),
                                                   ("text", None, 40)])
def test_stats_count_the_rows_max_seq_len_cut(tmp_path, kind, rel, max_seq_len):
    """A row is truncated when its whole tokenization (no --max-seq-len) is longer than max_seq_len (the
    plain text set: than max_seq_len - 1, TorchTune's text completion leaves room for nothing after); a
    preference row when either sequence is. Were: rows exactly max_seq_len long counted, text rows never
    (cut to max_seq_len - 1), preference sequences counted as rows (50 "truncated rows" of 25)."""
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    if rel is None:  # alpaca's outputs as a text set
        path = tmp_path / "text.jsonl"
        path.write_text("".join(json.dumps({"text": row["output"]}) + "\n"
                                for row in rows(os.path.join(TEXT, CASES["alpaca"][0]))))
    else:
        path = os.path.join(TEXT, rel)
    whole = [json.loads(line) for line in subprocess.run(
        [BIN, "data", "stats", "--dataset", kind, "--data", path, "--tokenizer", TOKENIZER, "--dump", "100000"],
        capture_output=True, timeout=300, check=True).stdout.decode().splitlines()]
    lengths = [[len(row[k]) for k in ("chosen_tokens", "rejected_tokens") if k in row] or [len(row["tokens"])]
               for row in whole]
    room = max_seq_len - 1 if kind == "text" else max_seq_len
    expected = sum(max(n) > room for n in lengths)
    proc = subprocess.run([BIN, "data", "stats", "--dataset", kind, "--data", path, "--tokenizer", TOKENIZER,
                           "--max-seq-len", str(max_seq_len)], capture_output=True, timeout=300, check=True)
    (line,) = [x for x in proc.stdout.decode().splitlines() if x.startswith("truncated rows")]
    assert 0 < expected < len(whole) and int(line.split()[-1]) == expected, (line, expected, len(whole))


def test_a_byte_order_mark_opening_the_file_is_dropped(tmp_path):
    """Was: a CSV saved as Excel's "CSV UTF-8" read its first column as "\ufeffinput", and the rows were
    refused as missing "input". Python's utf-8-sig, pandas and HF datasets drop the mark; so does mgbench
    (JSON and JSON Lines: nlohmann's parser always did)."""
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    plain = os.path.join(TEXT, "grammar/c4_200m_first1k.csv")
    with open(plain, encoding="utf-8") as f:
        text = f.read()
    marked = tmp_path / "marked.csv"
    marked.write_text(text, encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    assert dump("grammar", str(marked)) == dump("grammar", plain)


def test_a_quoted_empty_value_is_a_row_and_a_blank_line_is_none(tmp_path):
    """A one-column CSV: `""` is a row holding the empty text, a blank line no row, as Python's csv
    module reads them (was: both skipped as blank lines: 2 rows of 3)."""
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    path = tmp_path / "t.csv"
    path.write_text('text\nhello\n""\n\nworld\n')
    import csv
    with open(path, newline="") as f:
        expected = len(list(csv.DictReader(f)))
    proc = subprocess.run([BIN, "data", "stats", "--dataset", "text", "--data", str(path), "--tokenizer", TOKENIZER],
                          capture_output=True, text=True, timeout=60)
    assert expected == 3 and proc.returncode == 0 and f"(text), {expected} rows" in proc.stdout, proc.stdout + proc.stderr


def test_bad_rows_name_file_and_row(tmp_path):
    if not os.path.exists(TOKENIZER):
        pytest.skip("no Llama 3 tokenizer")
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps([{"instruction": "a", "output": "b"}, {"instruction": "c"}]))
    proc = run_data(missing)
    assert proc.returncode == 1 and b"missing.json' row 2" in proc.stderr and b'"output"' in proc.stderr
    typed = tmp_path / "typed.jsonl"
    typed.write_text('{"instruction": "a", "output": "b"}\n\n{"instruction": 5, "output": "b"}\n')
    proc = run_data(typed)
    assert proc.returncode == 1 and b"typed.jsonl' line 3" in proc.stderr and b"expected a string" in proc.stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a", \n')
    proc = run_data(broken)
    assert proc.returncode == 1 and b"broken.jsonl' line 2" in proc.stderr and b"not valid JSON" in proc.stderr
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"instruction": "caf\xe9", "output": "b"}\n')
    proc = run_data(latin)
    assert proc.returncode == 1 and b"latin.jsonl' line 1" in proc.stderr, proc.stderr
    csv_quote = tmp_path / "quote.csv"
    csv_quote.write_text('input,output\n"unterminated,x\n')
    proc = run_data(csv_quote, "grammar")
    assert proc.returncode == 1 and b"quote.csv" in proc.stderr and b"malformed CSV" in proc.stderr
    csv_fields = tmp_path / "fields.csv"
    csv_fields.write_text("input,output\na,b\nc,d,e\n")
    proc = run_data(csv_fields, "grammar")
    assert proc.returncode == 1 and b"fields.csv' row 2 (line 3): 3 fields, the header has 2" in proc.stderr
    csv_twice = tmp_path / "twice.csv"  # a second "input" column would silently replace the first
    csv_twice.write_text("input,output,input\na,b,c\n")
    proc = run_data(csv_twice, "grammar")
    assert proc.returncode == 1 and b'twice.csv\' line 1: the header names column "input" twice (columns 1 and 3)' \
        in proc.stderr, proc.stderr
    orca = tmp_path / "orca.json"
    orca.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "x"}]}]))
    proc = run_data(orca, "slimorca")
    assert proc.returncode == 1 and b"orca.json' row 1" in proc.stderr and b'"bot"' in proc.stderr
    proc = run_data(tmp_path / "none.json")
    assert proc.returncode == 1 and b"none.json" in proc.stderr
    proc = subprocess.run([BIN, "data", "stats", "--dataset", "dolly", "--data", str(missing), "--tokenizer",
                           TOKENIZER], capture_output=True)
    assert proc.returncode == 2 and b"--dataset 'dolly'" in proc.stderr  # a bad option: exit 2
