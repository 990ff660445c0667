# Part of guest.sh, before run.sh: loads the soft-iWARP driver `cargo xtask` built for this
# kernel out of tree (xtask/src/siw_module.rs), when it built one. It creates no siw device:
# xtask/guest/with_siw.sh adds one around the siw tests, so that the rxe suite sees rxe only.
# A failure here is reported, not fatal: the rxe suite runs without siw.
siw_note() { echo "uverbs-guest: $*" > /dev/kmsg 2> /dev/null || true; echo "uverbs-guest: $*"; }
if [ -n "${UVERBS_SIW_MODULE:-}" ]; then
    # Its dependencies as the module lists them (6.12's siw needs ib_uverbs too), and the
    # crc32c implementation libcrc32c asks the crypto API for.
    deps=$(modinfo -F depends "$UVERBS_SIW_MODULE" 2>/dev/null | tr ',' ' ')
    if out=$({ for d in ib_core libcrc32c $deps; do modprobe "$d" || exit 1; done; modprobe crc32c_generic; } 2>&1) \
        && out=$(insmod "$UVERBS_SIW_MODULE" 2>&1); then
        export UVERBS_SIW_LOADED=1
        siw_note "siw: loaded $UVERBS_SIW_MODULE (vermagic $(modinfo -F vermagic "$UVERBS_SIW_MODULE" 2>/dev/null))"
    else
        siw_note "siw: loading $UVERBS_SIW_MODULE failed: $out"
    fi
else
    siw_note "siw: no siw.ko was built for this kernel (see xtask's output); running without siw"
fi
