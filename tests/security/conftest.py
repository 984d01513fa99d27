import sys
from pathlib import Path

# the dataflow tests' helpers (recipes, episodes, a real service on loopback)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))
