"""octavo.model_loader.gguf_reader against the gguf package (its writer makes the files, its
reader is the reference), and against hostile files: truncated at every byte, mutated bytes,
counts and lengths larger than the file, bad alignment, offsets and types."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from octavo.model_loader.gguf_reader import (
    GGML_TYPES,
    GGUFFormatError,
    GGUFReader,
    SkippedArray,
)

gguf = pytest.importorskip("gguf")


def test_type_table_matches_the_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES

    ours = {tid: (name, per, nbytes) for tid, (name, per, nbytes) in GGML_TYPES.items()}
    theirs = {int(q): (q.name, per, nbytes) for q, (per, nbytes) in GGML_QUANT_SIZES.items()}
    for tid, entry in ours.items():
        assert tid in theirs and theirs[tid] == entry, (tid, entry, theirs.get(tid))


def _write(path, metadata=(), tensors=()):
    w = gguf.GGUFWriter(str(path), "llama")
    for kind, key, value in metadata:
        getattr(w, f"add_{kind}")(key, value)
    for name, data, raw_dtype in tensors:
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


METADATA = [
    ("uint8", "t.u8", 200), ("int8", "t.i8", -100), ("uint16", "t.u16", 60000),
    ("int16", "t.i16", -30000), ("uint32", "t.u32", 4_000_000_000), ("int32", "t.i32", -7),
    ("float32", "t.f32", 0.1), ("uint64", "t.u64", 2**63 + 5), ("int64", "t.i64", -(2**62)),
    ("float64", "t.f64", 1e-300), ("bool", "t.bool", True), ("string", "t.str", "héllo\n{%"),
    ("array", "t.ints", [1, 2, 3]), ("array", "t.floats", [0.5, -2.25]),
    ("array", "t.strs", ["a", "", "ü" * 3]), ("array", "t.long", list(range(5000))),
    ("array", "t.longstrs", [f"tok{i}" for i in range(6000)]),
    ("string", "t.after", "still read"),
]


def _tensors():
    rng = np.random.default_rng(0)
    q8 = gguf.quants.quantize(rng.standard_normal((6, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    q4k = rng.integers(0, 256, size=(2, 144), dtype=np.uint8)  # two rows of one block
    bf16 = rng.integers(0, 2**16, size=(3, 8), dtype=np.uint16)
    return [
        ("a.f32", rng.standard_normal((5, 7)).astype(np.float32), None),
        ("a.f16", rng.standard_normal((4, 3, 2)).astype(np.float16), None),
        ("a.bf16", bf16.view(np.uint8).reshape(3, 16), gguf.GGMLQuantizationType.BF16),
        ("a.q8", q8, gguf.GGMLQuantizationType.Q8_0),
        ("a.q4k", q4k, gguf.GGMLQuantizationType.Q4_K),
        ("a.i32", np.arange(9, dtype=np.int32), None),
    ]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("gguf") / "sample.gguf", METADATA, _tensors())


def test_metadata_equals_the_gguf_reader(sample):
    ref = gguf.GGUFReader(str(sample))
    ours = GGUFReader(str(sample))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.fields) == keys
    for key in keys:
        want = ref.fields[key].contents()
        got = ours.fields[key]
        if key in ("t.long", "t.longstrs"):
            assert isinstance(got, SkippedArray) and len(got) == len(want), key
        else:
            assert got == want and type(got) is type(want.item() if isinstance(
                want, np.generic) else want), (key, got, want)
    assert ours.fields["t.after"] == "still read"


def test_arrays_up_to_keep_items_are_kept(sample):
    ours = GGUFReader(str(sample), keep_items=10_000)
    assert ours.fields["t.long"] == list(range(5000))
    assert ours.fields["t.longstrs"][5999] == "tok5999"


def test_tensors_equal_the_gguf_reader(sample):
    ref = {t.name: t for t in gguf.GGUFReader(str(sample)).tensors}
    ours = GGUFReader(str(sample)).tensors
    assert [t.name for t in ours] == list(ref)
    for t in ours:
        r = ref[t.name]
        assert t.shape == tuple(int(d) for d in r.shape)
        assert t.tensor_type == int(r.tensor_type) and t.type_name == r.tensor_type.name
        assert (t.data_offset, t.n_bytes, t.n_elements) == (r.data_offset, r.n_bytes,
                                                              r.n_elements)
        want = r.data.view(np.uint16) if t.type_name == "BF16" else r.data
        assert t.data.dtype == want.dtype and t.data.shape == want.shape, t.name
        assert np.array_equal(t.data, want), t.name
        assert not t.data.flags.writeable


def test_the_default_model_equals_the_gguf_reader():
    from octavo.default_model import default_model_path

    try:
        path = default_model_path()
    except ValueError as e:
        pytest.skip(str(e))
    ref = gguf.GGUFReader(path)
    ours = GGUFReader(path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        got, want = ours.fields[key], field.contents()
        assert len(got) == len(want) if isinstance(got, SkippedArray) else got == want, key
    assert isinstance(ours.fields["tokenizer.ggml.tokens"], SkippedArray)
    for t, r in zip(ours.tensors, ref.tensors, strict=True):
        assert (t.name, t.data_offset, t.n_bytes) == (r.name, r.data_offset, r.n_bytes)
        assert np.array_equal(t.data, r.data), t.name


# ------------------------------------------------------------------------------ hostile files

def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _file(kvs: bytes = b"", n_kv: int = 0, tensors: bytes = b"", n_tensors: int = 0,
          data: bytes = b"", version: int = 3, pad_to: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + tensors
    return head + b"\0" * (-len(head) % pad_to) + data


def _tensor(name="w", dims=(4,), type_id=0, offset=0) -> bytes:
    return (_s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", type_id, offset))


def _kv_u32(key: str, value: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, value)


HOSTILE = {
    "empty": b"",
    "bad magic": b"GGUG" + bytes(20),
    "version 1": _file(version=1),
    "big-endian": b"GGUF" + struct.pack(">I", 3) + bytes(16),
    "huge key count": _file(n_kv=2**63),
    "huge tensor count": _file(n_tensors=2**64 - 1),
    "huge key length": _file(_s("k")[:0] + struct.pack("<Q", 2**64 - 1) + b"k", n_kv=1),
    "huge array": _file(_s("k") + struct.pack("<IIQ", 9, 4, 2**61), n_kv=1),
    "huge string array": _file(_s("k") + struct.pack("<IIQ", 9, 8, 10**12), n_kv=1),
    "string item too long": _file(_s("k") + struct.pack("<IIQ", 9, 8, 1)
                                  + struct.pack("<Q", 2**40), n_kv=1),
    "nested array": _file(_s("k") + struct.pack("<IIQ", 9, 9, 1), n_kv=1),
    "unknown value type": _file(_s("k") + struct.pack("<I", 13), n_kv=1),
    "invalid utf-8 key": _file(_s(b"\xff\xfe") + struct.pack("<II", 4, 1), n_kv=1),
    "invalid utf-8 value": _file(_s("k") + struct.pack("<I", 8) + _s(b"a\xc3"), n_kv=1),
    "duplicate key": _file(_kv_u32("k", 1) + _kv_u32("k", 2), n_kv=2),
    "zero alignment": _file(_kv_u32("general.alignment", 0), n_kv=1),
    "odd alignment": _file(_kv_u32("general.alignment", 48), n_kv=1),
    "zero dimensions": _file(tensors=_tensor(dims=()), n_tensors=1, data=bytes(16)),
    "five dimensions": _file(tensors=_tensor(dims=(1,) * 5), n_tensors=1, data=bytes(16)),
    "unknown tensor type": _file(tensors=_tensor(type_id=99), n_tensors=1, data=bytes(16)),
    "row not whole blocks": _file(tensors=_tensor(dims=(33,), type_id=8), n_tensors=1,
                                  data=bytes(64)),
    "misaligned offset": _file(tensors=_tensor(offset=4), n_tensors=1, data=bytes(64)),
    "tensor past the end": _file(tensors=_tensor(dims=(1000,)), n_tensors=1, data=bytes(16)),
    "huge dimensions": _file(tensors=_tensor(dims=(2**32, 2**32)), n_tensors=1, data=bytes(16)),
    "duplicate tensor": _file(tensors=_tensor() + _tensor(offset=32), n_tensors=2,
                              data=bytes(64)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_is_a_clear_error(tmp_path, case):
    path = tmp_path / "bad.gguf"
    path.write_bytes(HOSTILE[case])
    with pytest.raises(GGUFFormatError, match="bad.gguf"):
        GGUFReader(str(path))


def test_a_hand_made_file_parses(tmp_path):
    # The builder above makes valid files too, so the hostile cases fail for their one defect.
    path = tmp_path / "ok.gguf"
    kvs = _kv_u32("general.alignment", 64) + _s("name") + struct.pack("<I", 8) + _s("x")
    path.write_bytes(_file(kvs, 2, _tensor(dims=(4, 2)) + _tensor("v", offset=64), 2,
                           np.arange(24, dtype=np.float32).tobytes(), pad_to=64))
    r = GGUFReader(str(path))
    assert r.fields == {"general.alignment": 64, "name": "x"}
    assert r.data_offset % 64 == 0
    assert r.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert r.tensors[1].data.tolist() == [16, 17, 18, 19]


SMALL = [m for m in METADATA if m[1] not in ("t.long", "t.longstrs")]


def test_every_truncation_is_a_clear_error(tmp_path):
    src = _write(tmp_path / "small.gguf", SMALL, _tensors())
    raw = src.read_bytes()
    header_end = GGUFReader(str(src)).data_offset
    path = tmp_path / "cut.gguf"
    # Every cut inside the header, then a spread of cuts through the tensor data.
    cuts = list(range(header_end)) + list(range(header_end, len(raw), 97))
    for n in cuts:
        path.write_bytes(raw[:n])
        with pytest.raises(GGUFFormatError):
            GGUFReader(str(path))


def test_mutated_bytes_parse_or_fail_clearly(tmp_path):
    src = _write(tmp_path / "small.gguf", SMALL, _tensors()[:2])
    raw = bytearray(src.read_bytes())
    header_end = GGUFReader(str(src)).data_offset
    rng = random.Random(0)
    path = tmp_path / "mutant.gguf"
    for _ in range(400):
        mutant = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            mutant[rng.randrange(header_end)] = rng.randrange(256)
        path.write_bytes(bytes(mutant))
        try:
            r = GGUFReader(str(path))
        except GGUFFormatError:
            continue
        for t in r.tensors:  # whatever parsed lies inside the file
            assert t.data.nbytes == t.n_bytes
