"""(Re)generate the built-in demo dataset: `python scripts/prepare_demo_data.py [--root data/demo3d] [--cases 40]`."""

import argparse

from medseg.data.demo import generate_demo_dataset

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="data/demo3d", help="output folder (default: data/demo3d)")
    parser.add_argument("--cases", type=int, default=40, help="number of volumes (default: 40)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args()
    print(f"wrote {generate_demo_dataset(args.root, num_cases=args.cases, seed=args.seed)}")
