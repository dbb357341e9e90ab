"""`python -m specprobe …` — the same CLI as `specprobe …` (torchrun starts it this way:
`torchrun --nproc-per-node N -m specprobe diagnose …`)."""

from specprobe.cli.main import run

if __name__ == "__main__":
    run()
