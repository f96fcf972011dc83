"""`blink generate` as a user runs it: the default demo model, --json, and one-line errors with exit 2."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # spawns processes


def blink(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blink", *args], capture_output=True, text=True, timeout=300)


def test_default_model_json_and_batched_prompts():
    done = blink("generate", "--prompt", "Once upon a time", "--prompt-ids", "5,6,7", "--max-tokens", "4",
                 "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [o["prompt"] for o in lines] == ["Once upon a time", None]
    assert lines[1]["prompt_token_ids"] == [5, 6, 7]
    assert all(len(o["token_ids"]) == 4 and o["finish_reason"] == "length" for o in lines)
    assert all(isinstance(o["text"], str) for o in lines)


def test_bad_model_dirs_give_one_line_and_exit_2(tmp_path):
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    (tmp_path / "empty").mkdir()
    for model in [str(tmp_path / "missing"), str(tmp_path / "gpt2"), str(tmp_path / "empty")]:
        done = blink("generate", "--model", model, "--prompt-ids", "1,2")
        assert done.returncode == 2, (model, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert done.stderr.startswith("blink: error:")
    done = blink("generate", "--model", "tiny-llama", "--prompt-ids", "1,x")
    assert done.returncode == 2 and "comma-separated integers" in done.stderr
