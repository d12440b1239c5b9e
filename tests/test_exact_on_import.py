"""tests/tinker_server.py's sitecustomize: every process the Tinker server starts runs it, so it must not import
torch itself, and the float64 patch (tests/exact.py) must still be in place once a process loads Llama."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from tests.tinker_server import SITE


def _run(tmp_path, code: str, exact: bool = True) -> list[str]:
    (tmp_path / "sitecustomize.py").write_text(SITE)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items() if k != "RLVR_TEST_EXACT"},
                              **({"RLVR_TEST_EXACT": "1"} if exact else {}), "PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_startup_imports_no_torch_and_llama_gets_the_patch(tmp_path):
    code = ("import sys\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
            "from transformers import AutoModelForCausalLM, LlamaConfig\n"
            "AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,"
            " num_attention_heads=2, vocab_size=10))\n"
            "from transformers.models.llama import modeling_llama as m\n"
            "from tests import exact\n"
            "print(m.LlamaRMSNorm.forward is exact._rms_forward,\n"
            "      m.LlamaRotaryEmbedding.forward is exact._rope_forward)\n")
    assert _run(tmp_path, code) == ["False", "False", "True", "True"]


def test_without_the_variable_nothing_is_patched(tmp_path):
    code = ("from transformers.models.llama import modeling_llama as m\n"
            "from tests import exact\n"
            "print(m.LlamaRMSNorm.forward is exact._rms_forward)\n")
    assert _run(tmp_path, code, exact=False) == ["False"]
