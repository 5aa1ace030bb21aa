//! What the tests of real Python workers share: the interpreter they start workers with.

use std::path::PathBuf;

const PYTHON_ENV: &str = "SPINDLE_TEST_PYTHON";
const REQUIRE_ENV: &str = "SPINDLE_TEST_REQUIRE_PYTHON";

/// The test interpreter (`SPINDLE_TEST_PYTHON`), or `None` after saying loudly that the test
/// is skipped; a missing one fails the test when `SPINDLE_TEST_REQUIRE_PYTHON` is set (CI).
pub fn test_python(test: &str) -> Option<PathBuf> {
    match std::env::var(PYTHON_ENV) {
        Ok(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "{REQUIRE_ENV} is set but {PYTHON_ENV} is not");
            eprintln!(
                "\n*** SKIPPED: {test}: {PYTHON_ENV} is not set (a Python with langgraph and \
                 spindle_worker; scripts/test makes python/spindle-worker/.venv for it) ***\n"
            );
            None
        }
    }
}
