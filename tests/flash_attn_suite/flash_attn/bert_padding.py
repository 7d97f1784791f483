"""FlashAttention's own pad_input/unpad_input, loaded from the FlashAttention source the
suite runs against (FATTN_FA_SOURCE: the unpacked sdist scripts/fa-tests.sh fetched): the
tests' padding is theirs, not fattn's."""
import importlib.util
import os

_path = os.path.join(os.environ["FATTN_FA_SOURCE"], "flash_attn", "bert_padding.py")
_spec = importlib.util.spec_from_file_location("flash_attn._source_bert_padding", _path)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
pad_input, unpad_input = _module.pad_input, _module.unpad_input
