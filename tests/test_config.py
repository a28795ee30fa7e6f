"""Settings that cannot work together are refused when the process starts, not at first use."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpulens.config import Settings


def test_slurmrestd_without_a_token_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="GPULENS_SLURM_URL needs GPULENS_SLURM_TOKEN"):
        Settings(_env_file=None, slurm_url="http://slurm:6820")  # type: ignore[call-arg]
    token_file = tmp_path / "jwt"
    token_file.write_text("x")
    with pytest.raises(ValidationError, match="not both"):
        Settings(_env_file=None, slurm_url="http://s", slurm_token="t", slurm_token_file=token_file)  # type: ignore[call-arg]
    assert Settings(_env_file=None, slurm_url="http://s", slurm_token="t").slurm_jwt() == "t"  # type: ignore[call-arg]
    assert Settings(_env_file=None, slurm_url="http://s", slurm_token_file=token_file).slurm_jwt() == "x"  # type: ignore[call-arg]
    assert Settings(_env_file=None).slurm_url is None  # type: ignore[call-arg]  # no Slurm: nothing asked
