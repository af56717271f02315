"""Tensors that claim to live on a CUDA device, for testing cake's error paths without a GPU.

FakeCuda exports a DLPack capsule with device (kDLCUDA, id) over an address that nothing may
read: every call a test makes with them must fail in validation, before any kernel launch (a
launch on a machine without a GPU would fail with a CUDA error, which the tests would catch too).
Each FakeCuda gets addresses of its own, as far apart as its shape reaches, so that cake's check
that no output shares memory with an input passes unless a test passes the same FakeCuda twice.
"""

import ctypes
import itertools


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _Deleter)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@_Deleter
def _no_delete(_):
    pass  # the FakeCuda object owns every buffer


_DTYPES = {"float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16),
           "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8)}
_CUDA = 2
_SPAN = 1 << 36  # bytes of address space per FakeCuda: more than any test's tensor reaches
_addresses = itertools.count(1 << 44, _SPAN)  # 256-aligned; nothing reads them


class FakeCuda:
    """A [shape] tensor of dtype on cuda:device_id (row-major unless strides are given, in
    elements). Pass it wherever cake.abi takes a tensor."""

    def __init__(self, shape, dtype="bfloat16", *, strides=None, device_id=0):
        self.shape, self.dtype, self.device_id = tuple(shape), dtype, device_id
        if strides is None:
            strides, step = [], 1
            for n in reversed(self.shape):
                strides.insert(0, step)
                step *= n
        self.strides = tuple(strides)
        self._address = next(_addresses)
        self._keep = []

    def __dlpack_device__(self):
        return (_CUDA, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        n = max(len(self.shape), 1)
        shape = (ctypes.c_int64 * n)(*self.shape)
        strides = (ctypes.c_int64 * n)(*self.strides)
        managed = _Managed()
        code, bits = _DTYPES[self.dtype]
        managed.dl_tensor = _Tensor(self._address, _Device(_CUDA, self.device_id), len(self.shape),
                                    _DataType(code, bits, 1), shape, strides, 0)
        managed.deleter = _no_delete
        self._keep.extend([managed, shape, strides])
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)
