"""Shared pytest setup: import the flat modules from the repository root, never reach a hub."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import json  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tok():
    """The default model's real tokenizer (no download)."""
    import policy

    return policy.load_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A tiny random Llama with that tokenizer's vocabulary."""
    import policy

    return policy.tiny_model(tok)


@pytest.fixture(scope="session")
def prompts(tok):
    """Two short chat prompts (token ids) built as at rollout time."""
    import compress

    return [compress.build_prompt(tok, [], "Goal: click\nURL: file:///a.html\n[3] button 'OK'"),
            compress.build_prompt(tok, [], "Goal: type hello\nURL: file:///b.html\n[7] textbox ''\n[8] button 'Go'")]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """A demos file of 8 one-turn click-button expert trajectories (experts.py's format)."""
    path = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    obs = "Goal: Click on the \"{0}\" button.\nURL: file:///m/miniwob/click-button.html\n[12] button '{0}'\n[13] button 'No'"
    with open(path, "w") as f:
        for i in range(8):
            f.write(json.dumps({"task": "click-button", "seed": i, "goal": "", "source": "expert", "success": True,
                                "reward": 1.0, "env_error": False,
                                "turns": [{"observation": obs.format(f"b{i}"), "action": "click('12')", "error": ""}]}) + "\n")
    return str(path)


@pytest.fixture
def dream_inputs(tmp_path, tok):
    """A dream run's inputs: a tiny world model saved to tmp_path/wm and 4 one-turn click-button
    demonstrations. Returns (world model folder, demonstrations file, the world model)."""
    import policy

    wm_dir = str(tmp_path / "wm")
    start = policy.tiny_model(tok, seed=1)
    start.save_pretrained(wm_dir)
    tok.save_pretrained(wm_dir)
    demos = tmp_path / "demos.jsonl"
    obs = "Goal: Click on the \"{0}\" button.\nURL: file:///m/miniwob/click-button.html\n[12] button '{0}'"
    demos.write_text("".join(json.dumps({"task": "click-button", "seed": i, "success": True, "turns": [
        {"observation": obs.format(i), "action": "click('12')"}]}) + "\n" for i in range(4)))
    return wm_dir, demos, start
