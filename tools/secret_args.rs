//! Command-line arguments that may hold a secret — a database or broker
//! URL — as clap reads them: an argument error never shows one as typed,
//! only as `tickbox::redact::redact_url` shows it. One file, included (`#[path]`)
//! by every binary of the workspace that takes such an argument: the
//! operator's tool, the benchmark and the examples.

use clap::builder::TypedValueParser;
use clap::error::{ContextKind, ContextValue};
use std::ffi::{OsStr, OsString};

/// The value parser of an argument that may hold a secret: `P`'s, except
/// that the value it refuses is quoted redacted in the error (clap quotes
/// it whole: `invalid value 'postgres//u:S3cret@h' for '--database-url'`).
/// `#[arg(long, value_parser = Secret(postgres_url))]`.
#[derive(Clone)]
pub(crate) struct Secret<P>(pub(crate) P);

impl<P: TypedValueParser> TypedValueParser for Secret<P> {
    type Value = P::Value;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Self::Value, clap::Error> {
        self.0.parse_ref(cmd, arg, value).map_err(|mut error| {
            let shown = tickbox::redact::redact_url(&value.to_string_lossy());
            error.insert(ContextKind::InvalidValue, ContextValue::String(shown));
            error
        })
    }
}

/// `text` (a usage error, a failure) with every argument of `args` that
/// `tickbox::redact::redact_url` would change shown redacted: clap quotes an
/// argument it did not expect as typed, and a URL given without its flag
/// is one. A plain word (letters, digits, `-`, `_`, `.`) is left as typed:
/// it names a command, a flag or a file far more often than it is a
/// password, and is replaced nowhere else in the text.
pub(crate) fn redact_arguments(text: &str, args: &[OsString]) -> String {
    let plain = |arg: &str| {
        arg.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let mut text = text.to_string();
    for arg in args {
        let arg = arg.to_string_lossy();
        let arg = arg.trim();
        let shown = tickbox::redact::redact_url(arg);
        if !arg.is_empty() && !plain(arg) && shown != arg {
            text = text.replace(arg, &shown);
        }
    }
    text
}

/// Ends the process after clap's `error`, as clap would (`--help` and
/// `--version` on stdout, exit code 0; a usage error on stderr, exit code
/// 2), with the arguments of this process redacted in a usage error (see
/// [`redact_arguments`]).
pub(crate) fn exit(error: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        error.exit();
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    let text = redact_arguments(&error.render().to_string(), &args);
    eprintln!("{}", text.trim_end());
    std::process::exit(error.exit_code());
}
