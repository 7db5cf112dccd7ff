"""The modelled wafer against the real WSE-2, kernel by kernel: every WaferLLM measurement the model is checked
against, side by side with the modelled figure and their ratio (docs/ESTIMATES.md "Fidelity").

Run: python benchmarks/fidelity.py [--preset wse2]. Prints one row per figure (published, modelled, ratio,
whether it lies in 0.75-1.33), how it was modelled and what was fitted, and for a figure outside the band the
reason, measured from the model's breakdown. No Ray, about a second.
"""

from __future__ import annotations

import argparse
import textwrap

from waferrt.core.spec import spec_by_name
from waferrt.estimator.fidelity import BAND, figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="wse2", help="hardware preset (the figures are WSE-2 measurements)")
    spec = spec_by_name(ap.parse_args().preset)
    rows = figures(spec)
    print(f"WaferLLM's WSE-2 measurements vs the model ({spec.name}); a ratio in {BAND[0]}-{BAND[1]} reproduces it")
    print(f"{'figure':<48}{'published':>13}{'modelled':>13}{'unit':>7}{'ratio':>7}  ok")
    for f in rows:
        print(f"{f.what:<48}{f.published:>13,.6g}{f.modelled:>13,.6g}{f.unit:>7}{f.ratio:>7.2f}  "
              f"{'yes' if f.close else 'NO'}")
    for f in rows:
        print(f"\n{f.what} ({f.source})")
        for label, text in (("how", f.how), ("fitted", f.fitted), ("why off", f.reason)):
            if text:
                print(textwrap.fill(text, 118, initial_indent=f"  {label:<8}", subsequent_indent=" " * 10))
    print(f"\n{sum(f.close for f in rows)} of {len(rows)} figures within {BAND[0]}-{BAND[1]}; the others say why")


if __name__ == "__main__":
    main()
