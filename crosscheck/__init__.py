"""Where the engine meets its PyTorch witness: the one package that imports both.

convert moves weights across; compare holds the float64 and float32 rules; rounding rounds
every operation of a float64 run at random, the spread a whole model's float32 rule allows;
report is `numpy-engine parity`; interchange reads and writes .pt files; cli runs the
PyTorch-backed commands (`python -m crosscheck`, which `numpy-engine parity|export|import|bench`
hand over to).
"""
