"""mlirtuna: a database-backed tuning farm for rocMLIR kernels."""

__version__ = "0.1.0"
