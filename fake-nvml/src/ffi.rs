//! The C boundary: return codes, the panic guard, and typed views of the raw pointers
//! that NVML clients pass in. Every dereference of a client pointer in the crate goes
//! through the (unsafe) constructors here, whose contract is the NVML API contract:
//! a pointer argument is either null or valid for the access NVML documents.

use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, c_char};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};

pub(crate) type Ret = nvmlReturn_t;

pub(crate) const SUCCESS: Ret = nvmlReturn_enum_NVML_SUCCESS;
pub(crate) const UNINITIALIZED: Ret = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub(crate) const INVALID_ARGUMENT: Ret = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub(crate) const NOT_SUPPORTED: Ret = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub(crate) const NO_PERMISSION: Ret = nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
pub(crate) const NOT_FOUND: Ret = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub(crate) const INSUFFICIENT_SIZE: Ret = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub(crate) const DRIVER_NOT_LOADED: Ret = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub(crate) const TIMEOUT: Ret = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub(crate) const GPU_IS_LOST: Ret = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub(crate) const ARGUMENT_VERSION_MISMATCH: Ret =
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub(crate) const UNKNOWN: Ret = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// What the body of an exported function produces: `Err` carries a non-success code.
pub(crate) type Outcome = Result<(), Ret>;

/// Run the body of an exported function; a panic becomes `NVML_ERROR_UNKNOWN` instead of
/// unwinding into C (which would abort the client). The workspace never builds with
/// `panic = "abort"`, which would turn this into an abort.
pub(crate) fn guard(body: impl FnOnce() -> Outcome) -> Ret {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// A struct version word as NVML builds it: `sizeof(T) | version << 24`.
pub(crate) const fn struct_version<T>(version: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (version << 24)
}

/// An out-parameter: a client pointer we only write to.
pub(crate) struct Out<'a, T>(Option<&'a mut MaybeUninit<T>>);

impl<T> Out<'_, T> {
    /// # Safety
    /// `p` is null or valid for writing one `T` for the duration of the call.
    pub(crate) unsafe fn new(p: *mut T) -> Self {
        // SAFETY: per this function's contract, `p` is null or valid for writes;
        // `MaybeUninit<T>` has the layout of `T` and tolerates uninitialised memory.
        Out(unsafe { p.cast::<MaybeUninit<T>>().as_mut() })
    }

    /// The pointer was null.
    pub(crate) fn is_null(&self) -> bool {
        self.0.is_none()
    }

    /// Store `v`; a null pointer is `INVALID_ARGUMENT`.
    pub(crate) fn set(self, v: T) -> Outcome {
        let slot = self.0.ok_or(INVALID_ARGUMENT)?;
        slot.write(v);
        Ok(())
    }

    /// Zero every byte of the slot, padding included, then let `fill` set the fields:
    /// for structs with padding that some clients read as part of a wider field (pynvml
    /// reads the one-byte `nvmlGpuFabricState_t` as a `c_uint`).
    ///
    /// # Safety
    /// All-zero bytes are a valid `T` (a plain C struct).
    pub(crate) unsafe fn set_zeroed(self, fill: impl FnOnce(&mut T)) -> Outcome {
        let slot = self.0.ok_or(INVALID_ARGUMENT)?;
        // SAFETY: the slot is valid for one `T`; zero bytes are a valid `T` per this
        // function's contract, so it is initialised once written.
        let value = unsafe {
            std::ptr::write_bytes(slot.as_mut_ptr(), 0, 1);
            slot.assume_init_mut()
        };
        fill(value);
        Ok(())
    }
}

/// An in/out parameter: a client struct we read (a version word, a count) and fill.
pub(crate) struct InOut<'a, T>(Option<&'a mut T>);

impl<'a, T> InOut<'a, T> {
    /// # Safety
    /// `p` is null or valid for reading and writing one initialised `T` for the
    /// duration of the call.
    pub(crate) unsafe fn new(p: *mut T) -> Self {
        // SAFETY: per this function's contract.
        InOut(unsafe { p.as_mut() })
    }

    /// The referenced value; a null pointer is `INVALID_ARGUMENT`.
    pub(crate) fn get(self) -> Result<&'a mut T, Ret> {
        self.0.ok_or(INVALID_ARGUMENT)
    }
}

/// A client character buffer of a stated length.
pub(crate) struct CBuf<'a>(Option<&'a mut [MaybeUninit<c_char>]>);

impl CBuf<'_> {
    /// # Safety
    /// `p` is null or valid for writing `len` bytes for the duration of the call.
    pub(crate) unsafe fn new(p: *mut c_char, len: u32) -> Self {
        if p.is_null() {
            return CBuf(None);
        }
        // SAFETY: per this function's contract, `p` is valid for `len` byte writes.
        CBuf(Some(unsafe {
            std::slice::from_raw_parts_mut(p.cast::<MaybeUninit<c_char>>(), len as usize)
        }))
    }

    /// Copy `s` and a terminating NUL; `INSUFFICIENT_SIZE` when it does not fit.
    pub(crate) fn put_str(self, s: &str) -> Outcome {
        let buf = self.0.ok_or(INVALID_ARGUMENT)?;
        let bytes = s.as_bytes();
        if bytes.len() + 1 > buf.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (dst, &b) in buf.iter_mut().zip(bytes) {
            dst.write(b as c_char);
        }
        buf[bytes.len()].write(0);
        Ok(())
    }
}

/// Copy a string into a fixed-size C array inside a struct (NUL-terminated, truncated).
pub(crate) fn put_array_str<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let n = s.len().min(N - 1);
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    dst[n..].fill(0);
}

/// A NUL-terminated input string; `None` for null or non-UTF-8.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn in_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per this function's contract, `p` is a valid NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// A client array of `len` elements; `None` when the pointer is null.
///
/// # Safety
/// `p` is null or valid for reading and writing `len` initialised `T`s for the call.
pub(crate) unsafe fn in_slice<'a, T>(p: *mut T, len: usize) -> Option<&'a mut [T]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per this function's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// NVML's two-call protocol for array getters. `count` holds the capacity of `buf` on
/// entry and the number of entries on return. With nothing to report: count 0 and
/// success. When `buf` is null or too small: the needed count and `INSUFFICIENT_SIZE`.
///
/// # Safety
/// `count` is null or valid for reading and writing; when `buf` is non-null it is
/// valid for writing `*count` elements.
pub(crate) unsafe fn fill_list<T: Copy>(count: *mut u32, buf: *mut T, items: &[T]) -> Outcome {
    // SAFETY: per this function's contract, `count` is null or valid.
    let count = unsafe { InOut::new(count) }.get()?;
    let need = items.len() as u32;
    if need == 0 {
        *count = 0;
        return Ok(());
    }
    if buf.is_null() || *count < need {
        *count = need;
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is non-null and, per this function's contract, valid for `*count`
    // (>= `need`) element writes; `MaybeUninit<T>` accepts uninitialised memory.
    let dst =
        unsafe { std::slice::from_raw_parts_mut(buf.cast::<MaybeUninit<T>>(), need as usize) };
    for (d, s) in dst.iter_mut().zip(items) {
        d.write(*s);
    }
    *count = need;
    Ok(())
}

/// The text `nvmlErrorString` gives for a return code.
pub(crate) fn error_text(code: Ret) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => {
            c"The requested vgpu operation is not available on target device because ECC is enabled"
        }
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not Ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        30 => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}
