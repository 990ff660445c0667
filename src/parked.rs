//! A provider's half of a kernel object, parked when the user's handle drops while other
//! objects still hold the kernel object: released only once the kernel object is destroyed.

use std::sync::Mutex;

/// The half a dropped handle left behind (empty while the handle lives).
pub(crate) struct Parked<T: ?Sized>(Mutex<Option<Box<T>>>);

impl<T: ?Sized> Parked<T> {
    pub(crate) fn new() -> Self {
        Self(Mutex::new(None))
    }

    /// Keeps `half` until [`Parked::release`].
    pub(crate) fn park(&self, half: Box<T>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(half);
    }

    /// Drops the parked half once the kernel object is gone; leaks it if the kernel still
    /// has the object (it may yet write into the half's memory).
    pub(crate) fn release(&mut self, kernel_object_gone: bool) {
        let half = self.0.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if !kernel_object_gone {
            std::mem::forget(half);
        }
    }
}
