"""find_boxed_spans / span_masks: hand-checked cases (character tokenizer) and a locally trained byte-level BPE."""

from __future__ import annotations

import random

import pytest
import torch
from credit_helpers import right_pad
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from pipeline.credit import answer_mask_from_spans, find_boxed_spans, span_masks
from pipeline.tasks.boxed import boxed_contents


def encode_rows(tokenizer, texts, eos=True):
    rows = [tokenizer(t, add_special_tokens=False).input_ids + ([tokenizer.eos_token_id] if eos else []) for t in texts]
    return right_pad(rows, tokenizer.pad_token_id), right_pad([[1] * len(r) for r in rows], 0)


def spans_of(tokenizer, texts, which="first", eos=True):
    ids, mask = encode_rows(tokenizer, texts, eos)
    return find_boxed_spans(tokenizer, ids, mask, which=which).tolist()


# With one token per character, token indices are character indices: every expectation below is counted by hand.
@pytest.mark.parametrize(
    ("text", "which", "expected"),
    [
        ("a\\boxed{x^{2}}b", "first", [1, 8, 14]),  # nested braces: the outer box
        ("\\boxed{1 and \\boxed{2}", "first", [13, 20, 22]),  # the unbalanced first marker is skipped
        ("x \\boxed{5}", "first", [2, 9, 11]),  # answer at the very end (then EOS)
        ("\\boxed{1}, \\boxed{22}", "first", [0, 7, 9]),
        ("\\boxed{1}, \\boxed{22}", "last", [11, 18, 21]),
        ("\\boxed{}", "first", [0, 7, 8]),  # empty content
        ("no box {here}", "first", [-1, -1, -1]),
        ("\\boxed{3", "first", [-1, -1, -1]),  # never closed
    ],
)
def test_char_tokenizer_known_spans(char_tokenizer, text, which, expected):
    assert spans_of(char_tokenizer, [text], which) == [expected]


def test_rows_padding_eos_and_end_of_row(char_tokenizer):
    texts = ["\\boxed{7}", "long text then \\boxed{12}!", "none"]
    assert spans_of(char_tokenizer, texts) == [[0, 7, 9], [15, 22, 25], [-1, -1, -1]]
    assert spans_of(char_tokenizer, texts[:1], eos=False) == [[0, 7, 9]]  # box is the last token of the row


def test_only_masked_positions_count(char_tokenizer):
    ids, mask = encode_rows(char_tokenizer, ["ab \\boxed{12} c", "\\boxed{1}"])
    mask[0, 12:] = 0  # cut inside the box: "ab \boxed{12" is incomplete
    mask[1] = 0  # a truncated row (mask_truncated_completions)
    assert find_boxed_spans(char_tokenizer, ids, mask).tolist() == [[-1, -1, -1], [-1, -1, -1]]


def test_invalid_which(char_tokenizer):
    ids, mask = encode_rows(char_tokenizer, ["\\boxed{1}"])
    with pytest.raises(ValueError, match="which"):
        find_boxed_spans(char_tokenizer, ids, mask, which="middle")


def test_span_masks_known_answer():
    spans = torch.tensor([[1, 8, 11], [-1, -1, -1], [0, 2, 3]])
    masks = span_masks(spans, 13)

    def rows(mask):
        return [[t for t in range(13) if mask[i, t]] for i in range(3)]

    assert rows(masks.answer) == [list(range(1, 11)), [], [0, 1, 2]]
    assert rows(masks.boundary) == [[1, 2, 3, 4, 5, 6, 7, 10], [], [0, 1, 2]]
    assert rows(masks.content) == [[8, 9], [], []]
    assert rows(masks.post) == [[11, 12], [], list(range(3, 13))]
    assert torch.equal(answer_mask_from_spans(spans, 13), masks.answer)


# ---- byte-level BPE trained here, with tokens that merge across the box's edges ----

BPE_PIECES = ["We get ", "so ", "x", "12", "7", "≤", "π", ".", " ", "{", "}", "\\frac{1}{2}", "\\boxed{", "\\boxed{3}"]


def math_line(rng: random.Random) -> str:
    return "".join(rng.choice(BPE_PIECES) for _ in range(rng.randint(1, 12)))


@pytest.fixture(scope="module")
def bpe_tokenizer():
    rng = random.Random(0)
    corpus = [f"We get {rng.randint(0, 99)} so \\boxed{{{rng.randint(0, 99)}}}." for _ in range(300)]
    corpus += [math_line(rng) for _ in range(300)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what ByteLevel tokens are spelled in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def reference_span(tokenizer, ids: list[int], which: str) -> list[int]:
    """Minimal token cover computed from each token's own bytes (independent of decoding prefixes)."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids)
    lengths = [0 if i in special else len(tokenizer.convert_ids_to_tokens(i)) for i in ids]
    text = bytes(byte_of[c] for i in ids if i not in special for c in tokenizer.convert_ids_to_tokens(i)).decode()
    boxes = boxed_contents(text)
    if not boxes:
        return [-1, -1, -1]
    content_char, close_char = boxes[0] if which == "first" else boxes[-1]
    ends = [sum(lengths[: k + 1]) for k in range(len(ids))]

    def holder(char: int) -> int:
        byte = len(text[:char].encode())
        return next(k for k, end in enumerate(ends) if end > byte)

    return [holder(content_char - len("\\boxed{")), holder(content_char), holder(close_char) + 1]


def test_bpe_merges_across_box_edges(bpe_tokenizer):
    tokens = bpe_tokenizer.convert_ids_to_tokens(bpe_tokenizer("so \\boxed{3}.").input_ids)
    straddling = [t for t in tokens if ("{" in t and len(t) > 1 and not t.endswith("{")) or t in ("}.", "Ġ\\")]
    assert straddling, tokens


def sampled_ids(tokenizer, text: str, rng: random.Random, spell_bytes: bool) -> list[int]:
    """A non-canonical tokenization: the text cut at random characters, each piece encoded alone or (with
    ``spell_bytes``) sometimes spelled one byte token at a time, which splits multi-byte characters."""
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 8))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    byte_token = bytes_to_unicode()
    ids = []
    for piece in pieces:
        if spell_bytes and rng.random() < 0.5:
            ids += tokenizer.convert_tokens_to_ids([byte_token[b] for b in piece.encode()])
        else:
            ids += tokenizer(piece, add_special_tokens=False).input_ids
    return ids


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    which=st.sampled_from(["first", "last"]),
    tokenization=st.sampled_from(["canonical", "pieces", "bytes"]),
)
def test_bpe_spans_match_byte_reference(bpe_tokenizer, seed, which, tokenization):
    rng = random.Random(seed)
    text = math_line(rng) + "\\boxed{" + math_line(rng) + "}" + math_line(rng)
    if tokenization == "canonical":
        ids = bpe_tokenizer(text, add_special_tokens=False).input_ids
    else:
        ids = sampled_ids(bpe_tokenizer, text, rng, spell_bytes=tokenization == "bytes")
    ids = [*ids, bpe_tokenizer.eos_token_id]
    padded = torch.tensor([ids + [bpe_tokenizer.pad_token_id] * 3])
    mask = torch.tensor([[1] * len(ids) + [0] * 3])
    (span,) = find_boxed_spans(bpe_tokenizer, padded, mask, which=which).tolist()
    assert span == reference_span(bpe_tokenizer, ids, which)
    if span[0] >= 0:
        content_char, close_char = boxed_contents(text)[0 if which == "first" else -1]
        box_text = text[content_char - len("\\boxed{") : close_char + 1]
        assert box_text in bpe_tokenizer.decode(ids[span[0] : span[2]])
