"""Writes the README's C++ examples as one program (tests/install/run.sh
builds it against the installed package): the ```cpp blocks in README
order, their #include lines on top, the first block's body in main() and
each later block in a scope of its own inside it (they use the first one's
manager, state and comm). What the examples take as given (a step, the
tensors' memory) is defined here.

    python3 extract_readme.py README.md OUT.cc
"""

from __future__ import annotations

import re
import sys

GIVEN = """\
namespace {
// What the README's examples take as given.
int64_t step = 100;
std::vector<char> rng(16);
std::vector<uint16_t> wq(2048 * 4096), dst(8192 * 1024);  // BF16
void* wq_ptr = wq.data();
void* dst_ptr = dst.data();
}  // namespace
"""


def main(readme: str, out: str) -> None:
    blocks = re.findall(r"```cpp\n(.*?)```", open(readme).read(), flags=re.S)
    if not blocks:
        raise SystemExit(f"{readme}: no ```cpp block")
    includes, bodies = [], []
    for block in blocks:
        lines = block.splitlines()
        includes += [ln for ln in lines if ln.startswith("#include") and ln not in includes]
        bodies.append("\n".join("    " + ln if ln else "" for ln in lines
                                if not ln.startswith("#include")))
    text = ["// Generated from README.md by tests/install/extract_readme.py.",
            *includes, "#include <mpi.h>", "", "#include <cstdint>", "#include <vector>", "",
            GIVEN, "int main(int argc, char** argv) {", "  MPI_Init(&argc, &argv);", "  {",
            bodies[0]]
    for body in bodies[1:]:
        text += ["  {", body, "  }"]
    text += ["  }", "  MPI_Finalize();", "  return 0;", "}", ""]
    open(out, "w").write("\n".join(text))


if __name__ == "__main__":
    main(*sys.argv[1:])
