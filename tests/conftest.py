import os
import sys
from pathlib import Path

# Triton kernels run on CPU tensors through the interpreter in the test suite.
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
