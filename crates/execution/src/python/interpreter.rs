//! Which Python runs workers, and whether it has what they need.
//!
//! The choice, first match wins: the explicit setting (`--python` / `SPINDLE_PYTHON`), the
//! active virtualenv (`$VIRTUAL_ENV/bin/python`), the project's own `.venv`, then `python3`
//! on `PATH`. Before a worker is spawned one quick check (`python -c ...`, no import of
//! LangGraph itself) turns the usual set-up mistakes into one error that says what to run,
//! instead of a worker that dies on start with a traceback in the logs.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tokio::process::Command;

/// How long the check may take: it starts Python and reads package metadata, no more.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The oldest Python the worker package supports.
const MIN_PYTHON: (u32, u32) = (3, 10);

/// Prints one marked line, so whatever a `sitecustomize` prints around it is ignored. Written
/// to run on any Python 3 (and to say its version on an old one) before it imports anything
/// newer than `json`.
const CHECK_SCRIPT: &str = r#"
import json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable}
if sys.version_info >= (3, 10):
    from importlib import metadata, util
    try:
        out["langgraph"] = metadata.version("langgraph")
    except metadata.PackageNotFoundError:
        out["langgraph"] = None
    out["spindle_worker"] = util.find_spec("spindle_worker") is not None
print("SPINDLE_CHECK " + json.dumps(out))
"#;
const CHECK_MARK: &str = "SPINDLE_CHECK ";

/// Where the interpreter was found: error messages say it, so an operator knows what to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--python` / `SPINDLE_PYTHON`.
    Setting,
    /// `$VIRTUAL_ENV/bin/python`.
    VirtualEnv,
    /// `.venv/bin/python` in the project's directory.
    ProjectVenv,
    /// `python3` on `PATH`.
    Path,
}

/// The Python that will run workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub program: PathBuf,
    pub source: Source,
}

impl fmt::Display for Interpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = match self.source {
            Source::Setting => "the --python / SPINDLE_PYTHON setting",
            Source::VirtualEnv => "the active virtualenv, $VIRTUAL_ENV",
            Source::ProjectVenv => "the project's .venv",
            Source::Path => "python3 on PATH; name another with --python / SPINDLE_PYTHON",
        };
        write!(f, "`{}` (from {from})", self.program.display())
    }
}

/// What the check found in a usable interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonInfo {
    pub interpreter: Interpreter,
    /// `sys.executable`: the interpreter's own path, once symlinks and shims are followed.
    pub executable: String,
    pub python: String,
    pub langgraph: String,
}

/// Why workers cannot run on this interpreter: one error, saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("the project directory {0} does not exist")]
    NoProjectDir(PathBuf),
    #[error(
        "Python interpreter {interpreter} could not be started: {reason}. Install Python \
         {}.{} or later, or name an interpreter with --python / SPINDLE_PYTHON",
        MIN_PYTHON.0, MIN_PYTHON.1
    )]
    NotFound {
        interpreter: Interpreter,
        reason: String,
    },
    #[error(
        "Python interpreter {interpreter} did not run the package check ({status}){}; is it a \
         Python {}.{}+ interpreter?",
        tail(stderr), MIN_PYTHON.0, MIN_PYTHON.1
    )]
    NotPython {
        interpreter: Interpreter,
        status: String,
        stderr: String,
    },
    #[error(
        "Python interpreter {interpreter} did not finish the package check in {CHECK_TIMEOUT:?}"
    )]
    TimedOut { interpreter: Interpreter },
    #[error(
        "Python interpreter {interpreter} is Python {python}; Python workers need {}.{} or \
         later: name another interpreter with --python / SPINDLE_PYTHON",
        MIN_PYTHON.0, MIN_PYTHON.1
    )]
    TooOld {
        interpreter: Interpreter,
        python: String,
    },
    #[error(
        "Python interpreter {interpreter} (Python {python}) does not have langgraph: install it \
         into that interpreter with `{} -m pip install langgraph`",
        interpreter.program.display()
    )]
    LangGraphMissing {
        interpreter: Interpreter,
        python: String,
    },
    #[error(
        "Python interpreter {interpreter} has langgraph {langgraph}; Python workers need 1.0 or \
         later: `{} -m pip install -U langgraph`",
        interpreter.program.display()
    )]
    LangGraphTooOld {
        interpreter: Interpreter,
        langgraph: String,
    },
    #[error(
        "Python interpreter {interpreter} (Python {python}, langgraph {langgraph}) does not have \
         spindle_worker, the package that runs graphs for Spindle: install it into that \
         interpreter with `{} -m pip install {}`",
        interpreter.program.display(), worker_package().display()
    )]
    WorkerMissing {
        interpreter: Interpreter,
        python: String,
        langgraph: String,
    },
}

/// The last lines of a failed check's stderr, for its error message.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.trim().lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    format!(": {}", lines[lines.len().saturating_sub(3)..].join(" | "))
}

/// Where `pip install` finds the worker package: this source tree's copy when it is there
/// (a checkout), else a placeholder that says what to put.
pub fn worker_package() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/spindle-worker");
    here.canonicalize()
        .unwrap_or_else(|_| PathBuf::from("<Spindle's source checkout>/python/spindle-worker"))
}

/// The interpreter for workers of the project in `project_dir`; `setting` is the explicit
/// `--python` / `SPINDLE_PYTHON`, if any.
pub fn choose_interpreter(setting: Option<&Path>, project_dir: &Path) -> Interpreter {
    choose_from(setting, std::env::var_os("VIRTUAL_ENV"), project_dir)
}

fn choose_from(
    setting: Option<&Path>,
    virtual_env: Option<OsString>,
    project_dir: &Path,
) -> Interpreter {
    if let Some(program) = setting {
        // Taken as given even when missing: a typo must be reported, not skipped over.
        return Interpreter {
            program: program.to_owned(),
            source: Source::Setting,
        };
    }
    let candidates = [
        (
            virtual_env.map(|dir| PathBuf::from(dir).join("bin/python")),
            Source::VirtualEnv,
        ),
        (
            Some(project_dir.join(".venv/bin/python")),
            Source::ProjectVenv,
        ),
    ];
    for (program, source) in candidates {
        if let Some(program) = program.filter(|p| p.is_file()) {
            return Interpreter { program, source };
        }
    }
    Interpreter {
        program: PathBuf::from("python3"),
        source: Source::Path,
    }
}

/// Runs the check in the project's directory with the workers' extra `env` (a `PYTHONPATH`
/// there counts). Ok says the versions; an error says what to install.
pub async fn check_interpreter(
    interpreter: &Interpreter,
    project_dir: &Path,
    env: &BTreeMap<String, String>,
) -> Result<PythonInfo, InterpreterError> {
    if !project_dir.is_dir() {
        return Err(InterpreterError::NoProjectDir(project_dir.to_owned()));
    }
    let run = Command::new(&interpreter.program)
        .arg("-c")
        .arg(CHECK_SCRIPT)
        .current_dir(project_dir)
        .envs(env)
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CHECK_TIMEOUT, run).await {
        Err(_) => {
            return Err(InterpreterError::TimedOut {
                interpreter: interpreter.clone(),
            })
        }
        Ok(Err(e)) => {
            return Err(InterpreterError::NotFound {
                interpreter: interpreter.clone(),
                reason: e.to_string(),
            })
        }
        Ok(Ok(output)) => output,
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let found = stdout
        .lines()
        .find_map(|line| line.strip_prefix(CHECK_MARK))
        .and_then(|json| serde_json::from_str::<Found>(json).ok());
    match found {
        Some(found) if output.status.success() => classify(interpreter, found),
        _ => Err(InterpreterError::NotPython {
            interpreter: interpreter.clone(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }),
    }
}

/// The check script's line.
#[derive(Debug, Deserialize)]
struct Found {
    python: String,
    executable: String,
    #[serde(default)]
    langgraph: Option<String>,
    #[serde(default)]
    spindle_worker: bool,
}

fn classify(interpreter: &Interpreter, found: Found) -> Result<PythonInfo, InterpreterError> {
    let interpreter = interpreter.clone();
    if version_below(&found.python, MIN_PYTHON) {
        return Err(InterpreterError::TooOld {
            interpreter,
            python: found.python,
        });
    }
    let Some(langgraph) = found.langgraph else {
        return Err(InterpreterError::LangGraphMissing {
            interpreter,
            python: found.python,
        });
    };
    if version_below(&langgraph, (1, 0)) {
        return Err(InterpreterError::LangGraphTooOld {
            interpreter,
            langgraph,
        });
    }
    if !found.spindle_worker {
        return Err(InterpreterError::WorkerMissing {
            interpreter,
            python: found.python,
            langgraph,
        });
    }
    Ok(PythonInfo {
        interpreter,
        executable: found.executable,
        python: found.python,
        langgraph,
    })
}

/// Whether a version's `major.minor` is below `min`; a version that does not parse is not
/// refused here (the worker will say what is wrong).
fn version_below(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) < min,
        (Some(major), None) => major < min.0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(python: &str, langgraph: Option<&str>, worker: bool) -> Found {
        Found {
            python: python.into(),
            executable: "/x/python".into(),
            langgraph: langgraph.map(Into::into),
            spindle_worker: worker,
        }
    }

    fn interp() -> Interpreter {
        Interpreter {
            program: "/venv/bin/python".into(),
            source: Source::Setting,
        }
    }

    #[test]
    fn the_setting_wins_even_when_missing() {
        let got = choose_from(
            Some(Path::new("/nope/python")),
            Some("/also".into()),
            Path::new("/"),
        );
        assert_eq!(
            got,
            Interpreter {
                program: "/nope/python".into(),
                source: Source::Setting
            }
        );
    }

    #[test]
    fn then_virtualenv_then_project_venv_then_path() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        let venv = dir.path().join("active");
        for bin in [project.join(".venv/bin"), venv.join("bin")] {
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("python"), "").unwrap();
        }
        let got = choose_from(None, Some(venv.clone().into()), &project);
        assert_eq!(got.source, Source::VirtualEnv);
        assert_eq!(got.program, venv.join("bin/python"));
        // A VIRTUAL_ENV without an interpreter in it is passed over.
        let got = choose_from(None, Some(dir.path().join("gone").into()), &project);
        assert_eq!(got.source, Source::ProjectVenv);
        assert_eq!(got.program, project.join(".venv/bin/python"));
        let got = choose_from(None, None, dir.path());
        assert_eq!(
            got,
            Interpreter {
                program: "python3".into(),
                source: Source::Path
            }
        );
    }

    #[test]
    fn each_missing_piece_is_its_own_error() {
        let i = interp();
        assert!(matches!(
            classify(&i, found("3.9.18", None, false)),
            Err(InterpreterError::TooOld { .. })
        ));
        assert!(matches!(
            classify(&i, found("3.11.7", None, true)),
            Err(InterpreterError::LangGraphMissing { .. })
        ));
        assert!(matches!(
            classify(&i, found("3.11.7", Some("0.6.2"), true)),
            Err(InterpreterError::LangGraphTooOld { .. })
        ));
        assert!(matches!(
            classify(&i, found("3.12.1", Some("1.0.3"), false)),
            Err(InterpreterError::WorkerMissing { .. })
        ));
        let ok = classify(&i, found("3.13.0rc1", Some("1.2.22"), true)).unwrap();
        assert_eq!(
            (ok.python.as_str(), ok.langgraph.as_str()),
            ("3.13.0rc1", "1.2.22")
        );
    }

    #[test]
    fn messages_say_what_to_run() {
        let err = classify(&interp(), found("3.11.7", None, true))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/venv/bin/python -m pip install langgraph"),
            "{err}"
        );
        let err = classify(&interp(), found("3.11.7", Some("1.0.0"), false))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("-m pip install") && err.contains("spindle-worker"),
            "{err}"
        );
    }

    #[test]
    fn versions_compare_by_major_and_minor() {
        assert!(version_below("3.9.1", (3, 10)));
        assert!(!version_below("3.10.0", (3, 10)));
        assert!(!version_below("3.14.0a1", (3, 10)));
        assert!(version_below("0.6.11", (1, 0)));
        assert!(!version_below("1.0.0", (1, 0)));
        assert!(!version_below("weird", (1, 0)));
    }
}
