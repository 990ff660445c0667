//! The libibverbs functions this provider calls, found at load time in the libibverbs that
//! loaded it, by symbol *version*.
//!
//! A provider is tied to one private provider ABI (PABI) of libibverbs: the layouts in
//! [`crate::abi`] and these few entry points. rdma-core versions them together as
//! `IBVERBS_PRIVATE_<PABI>` and changes the number whenever one changes. Rather than linking
//! against `libibverbs.so` (which would need it at build time and make a mismatch a dynamic
//! linker error), the provider asks the dynamic linker for each symbol at exactly
//! `IBVERBS_PRIVATE_34` in the already-loaded `libibverbs.so.1`; if any is missing, it says
//! which PABI the running libibverbs has and does not register.

use crate::abi::{ibv_device, verbs_context, verbs_context_ops, verbs_device_ops};
use libc::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::sync::OnceLock;

/// The provider ABI this build implements (rdma-core up to v56 exports 34; v57 moved to 57).
pub const PABI: u32 = 34;
/// Its symbol version.
pub const PABI_VERSION: &CStr = c"IBVERBS_PRIVATE_34";
/// The library providers are loaded by.
const LIBIBVERBS: &CStr = c"libibverbs.so.1";

type RegisterDriverFn = unsafe extern "C" fn(*const verbs_device_ops);
type InitAndAllocContextFn =
    unsafe extern "C" fn(*mut ibv_device, c_int, usize, *mut verbs_context, u32) -> *mut c_void;
type UninitContextFn = unsafe extern "C" fn(*mut verbs_context);
type SetOpsFn = unsafe extern "C" fn(*mut verbs_context, *const verbs_context_ops);

/// libibverbs' provider-facing entry points, resolved at `IBVERBS_PRIVATE_34`.
pub struct Imports {
    /// `verbs_register_driver_34`: adds a provider to libibverbs' driver list.
    pub register_driver: RegisterDriverFn,
    /// `_verbs_init_and_alloc_context(device, cmd_fd, size, offset, driver_id)`: callocs
    /// `size` bytes and sets up the `verbs_context` found `offset` bytes in (libibverbs'
    /// private state, the dummy op table, the device reference); takes ownership of `cmd_fd`
    /// (closing it on failure, when it returns NULL). The memory is the provider's to `free`.
    pub init_and_alloc_context: InitAndAllocContextFn,
    /// `verbs_uninit_context`: undoes the init, closing `cmd_fd` and `async_fd` (not freeing).
    pub uninit_context: UninitContextFn,
    /// `verbs_set_ops`: installs the provider's op table.
    pub set_ops: SetOpsFn,
}

static IMPORTS: OnceLock<Imports> = OnceLock::new();

/// The resolved imports; `None` before a successful [`resolve`] (the provider is then never
/// registered, so libibverbs never calls into it).
pub fn imports() -> Option<&'static Imports> {
    IMPORTS.get()
}

/// Finds every import in the loaded libibverbs, or explains why not.
pub fn resolve() -> Result<&'static Imports, String> {
    if let Some(i) = IMPORTS.get() {
        return Ok(i);
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already in the process; the
    // name is a valid C string.
    let lib = unsafe { libc::dlopen(LIBIBVERBS.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if lib.is_null() {
        return Err(format!(
            "{} is not loaded in this process (the provider must be loaded by libibverbs)",
            LIBIBVERBS.to_string_lossy()
        ));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: `lib` is a live handle from dlopen; both strings are valid C strings.
        let p = unsafe { libc::dlvsym(lib, name.as_ptr(), PABI_VERSION.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "the running libibverbs has no {}@{}: it speaks {} (this provider needs \
                 provider ABI {PABI}, as in rdma-core v44..v56)",
                name.to_string_lossy(),
                PABI_VERSION.to_string_lossy(),
                describe_pabi(lib)
            ))
        } else {
            Ok(p)
        }
    };
    let register = sym(c"verbs_register_driver_34")?;
    let init = sym(c"_verbs_init_and_alloc_context")?;
    let uninit = sym(c"verbs_uninit_context")?;
    let set_ops = sym(c"verbs_set_ops")?;
    // SAFETY: each pointer is the named libibverbs function at the PABI whose C signature the
    // corresponding type spells (driver.h of rdma-core v44); a symbol version pins them.
    let imports = unsafe {
        Imports {
            register_driver: std::mem::transmute::<*mut c_void, RegisterDriverFn>(register),
            init_and_alloc_context: std::mem::transmute::<*mut c_void, InitAndAllocContextFn>(init),
            uninit_context: std::mem::transmute::<*mut c_void, UninitContextFn>(uninit),
            set_ops: std::mem::transmute::<*mut c_void, SetOpsFn>(set_ops),
        }
    };
    // The handle from RTLD_NOLOAD holds a reference; libibverbs outlives its providers anyway,
    // so keeping it is harmless.
    Ok(IMPORTS.get_or_init(|| imports))
}

/// Names the provider ABI the loaded libibverbs exports, by probing for
/// `verbs_register_driver_<N>` (the symbol rdma-core renames with each PABI).
fn describe_pabi(lib: *mut c_void) -> String {
    let found: Vec<String> = (1..=99u32)
        .filter(|n| {
            let name = format!("verbs_register_driver_{n}\0");
            // SAFETY: `lib` is a live dlopen handle and `name` is NUL-terminated.
            !unsafe { libc::dlsym(lib, name.as_ptr().cast::<c_char>()) }.is_null()
        })
        .map(|n| format!("IBVERBS_PRIVATE_{n}"))
        .collect();
    if found.is_empty() {
        "no provider ABI this provider recognizes".into()
    } else {
        found.join(", ")
    }
}
