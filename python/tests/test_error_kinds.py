"""The Python classes of qkv's error kinds (include/qkv/types.hpp): a bad argument is a ValueError;
qkv.IoError is an OSError, qkv.FormatError an OSError and a ValueError, qkv.NonFiniteError a
RuntimeError. One real failure of each kind through the package; the messages are the C++ ones."""

import pathlib
import struct

import numpy as np
import pytest

import qkv
import qkv.safetensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "data/models/stories260K/stories260K.bin"
TOKENIZER = ROOT / "data/models/stories260K/tok512.bin"


def test_the_classes_and_their_bases():
    assert issubclass(qkv.IoError, OSError) and not issubclass(qkv.IoError, ValueError)
    assert issubclass(qkv.FormatError, OSError) and issubclass(qkv.FormatError, ValueError)
    assert issubclass(qkv.NonFiniteError, RuntimeError) and not issubclass(qkv.NonFiniteError, ValueError)
    assert {"IoError", "FormatError", "NonFiniteError"} <= set(qkv.__all__)
    for c in (qkv.IoError, qkv.FormatError, qkv.NonFiniteError):
        assert c.__doc__ and c.__module__ == "qkv._qkv", c


def test_a_missing_file_is_a_bad_argument(tmp_path):
    with pytest.raises(ValueError, match=r"no such file") as e:
        qkv.Model.load(str(tmp_path / "missing.bin"))
    assert not isinstance(e.value, OSError)


def test_a_write_the_system_refuses_is_an_io_error(tmp_path):
    path = tmp_path / "no-such-folder" / "x.safetensors"
    with pytest.raises(qkv.IoError, match=r"cannot open the temporary .*No such file or directory") as e:
        qkv.safetensors.save_file({"x": np.zeros(3, np.float32)}, str(path))
    assert isinstance(e.value, OSError)


def test_a_corrupt_file_is_a_format_error(tmp_path):
    cut = tmp_path / "cut.bin"
    cut.write_bytes(MODEL.read_bytes()[:1000])
    with pytest.raises(qkv.FormatError, match=r"\[qkv::load_llama2c\] file '.*cut.bin': is 1000 bytes but its header"):
        qkv.Model.load(str(cut))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 9) + b'{"a": [1,')
    with pytest.raises(qkv.FormatError, match=r"header is not valid JSON"):
        qkv.safetensors.load_file(str(bad))
    # Code that caught ValueError before the class existed still catches it.
    with pytest.raises(ValueError):
        qkv.Model.load(str(cut))


def test_logits_that_overflow_are_a_non_finite_error(tmp_path):
    """Layer 0's w1 set to 3e38 (finite, so the loader takes it): W1·x overflows and the logits are
    NaN; generation stops naming the position (issue #16, defect 1)."""
    b = bytearray(MODEL.read_bytes())
    C, Hd, L, H, Hkv, V, P = struct.unpack("<7i", b[:28])
    D = C // H
    # llama2.c order: wte, rms_att, wq, wk, wv, wo, rms_ffn, then w1 (layer 0 first)
    at = 28 + 4 * (V * C + L * C + L * H * D * C + 2 * L * Hkv * D * C + L * C * H * D + L * C)
    b[at:at + 4 * Hd * C] = struct.pack("<f", 3e38) * (Hd * C)
    path = tmp_path / "overflow.bin"
    path.write_bytes(bytes(b))
    model = qkv.Model.load(str(path))
    tok = qkv.Tokenizer.load(str(TOKENIZER), V)
    with pytest.raises(qkv.NonFiniteError, match=r"the logits at position \d+ are not finite") as e:
        model.generate(tok, "Once upon", steps=20, temperature=0)
    assert isinstance(e.value, RuntimeError)
