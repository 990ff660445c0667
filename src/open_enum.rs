//! `open_enum!`: C enums the kernel fills in, as newtypes that accept any value.

/// Defines a transparent `u32` newtype with named constants and a `Debug` that prints the name
/// (or the raw number for values the kernel may add later). Any bit pattern is valid, so a
/// completion written by the kernel can never be undefined behaviour.
macro_rules! open_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $val:expr,)* }) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);
        impl $name {
            $($(#[$vm])* #[doc = concat!("`", stringify!($var), "`")] pub const $var: Self = Self($val);)*
            /// The verbs.h name, if this value has one.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $($val => Some(stringify!($var)),)* _ => None }
            }
        }
        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }
    };
}

pub(crate) use open_enum;
