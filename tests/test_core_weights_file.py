"""labkit.core.weights_file: a safetensors header read, and Pythia's file rebuilt from its preset."""
import math

import pytest

from labkit.core.presets import model_preset
from labkit.core.spec import ModelSpec
from labkit.core.weights_file import gpt_neox_tensor_shapes, read_safetensors_header, safetensors_bytes


def test_pythia_14m_file_rebuilt_from_its_preset_has_the_lesson_s_size_and_an_8496_byte_header():
    pythia = model_preset("Pythia-14M")
    shapes = gpt_neox_tensor_shapes(pythia)
    assert sum(math.prod(shape) for shape in shapes.values()) == pythia.n_params == 14_067_712
    data = safetensors_bytes(shapes, "fp16", {"format": "pt"})  # transformers' save_pretrained metadata
    header = read_safetensors_header(data)
    assert len(data) == 28_143_920  # the lesson's model.safetensors
    assert (header.header_bytes, header.table_bytes, header.data_bytes) == (8_496, 8_488, 28_135_424)
    assert header.metadata == {"format": "pt"} and len(header.tensors) == 76
    assert header.tensors["embed_out.weight"] == {"dtype": "F16", "shape": [50_304, 128],
                                                  "data_offsets": header.tensors["embed_out.weight"]["data_offsets"]}
    assert data[header.header_bytes - 1:header.header_bytes] == b" "  # padded with spaces to a multiple of 8
    # without the metadata entry the table is 32 bytes shorter: the header would be 8,464 bytes
    assert read_safetensors_header(safetensors_bytes(shapes, "fp16")).header_bytes == 8_464


def test_gpt_neox_names_and_shapes_are_transformers_own():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPTNeoXConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=256, tie_word_embeddings=False)
    model = transformers.GPTNeoXForCausalLM(config)
    saved = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    ours = gpt_neox_tensor_shapes(ModelSpec.from_config(config, name="tiny-neox"))
    # transformers 5 names the output matrix lm_head; the files on the Hub (saved by transformers 4) say embed_out
    renamed = {("lm_head.weight" if name == "embed_out.weight" else name): shape for name, shape in ours.items()}
    assert saved in (ours, renamed)


def test_safetensors_header_reads_what_the_library_writes_and_rejects_what_it_would_not():
    import struct

    torch = pytest.importorskip("torch")
    from safetensors.torch import save

    data = save({"b": torch.zeros(3, dtype=torch.float32), "a": torch.ones(2, 2, dtype=torch.bfloat16)})
    header = read_safetensors_header(data)
    assert header.header_bytes + header.data_bytes == len(data) and header.data_bytes == 12 + 8
    assert {name: entry["shape"] for name, entry in header.tensors.items()} == {"a": [2, 2], "b": [3]}
    with pytest.raises(ValueError, match="starts with an 8-byte length; got 5 bytes"):
        read_safetensors_header(b"12345")
    with pytest.raises(ValueError, match="says the JSON table has 100 bytes, but only 2 follow"):
        read_safetensors_header(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ValueError, match="not a JSON table"):
        read_safetensors_header(struct.pack("<Q", 2) + b"{x")
    with pytest.raises(ValueError, match="offsets must tile the payload"):
        table = b'{"w": {"dtype": "F16", "shape": [1], "data_offsets": [2, 4]}}'
        read_safetensors_header(struct.pack("<Q", len(table)) + table + bytes(4))
    with pytest.raises(ValueError, match="the tensors end at byte 4 of the payload, but 5 bytes follow"):
        table = b'{"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}'
        read_safetensors_header(struct.pack("<Q", len(table)) + table + bytes(5))
    with pytest.raises(TypeError, match="data must be bytes"):
        read_safetensors_header("not bytes")
    with pytest.raises(ValueError, match="n_kv_heads == n_heads"):
        gpt_neox_tensor_shapes(model_preset("Llama-3-8B"))
    with pytest.raises(ValueError, match=r"fmt must be one of \['bf16', 'fp16', 'fp32'\]"):
        safetensors_bytes({"w": (1,)}, "int4")
