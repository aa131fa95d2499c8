//! What code execution speaks: languages, contexts, run options and the events a run
//! streams.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A language a code context runs, each through a Jupyter kernel in the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum CodeLanguage {
    /// IPython (`ipykernel`): IPython syntax (`!ls`, `%cd`) and rich display work.
    Python,
    /// JavaScript.
    JavaScript,
    /// TypeScript.
    TypeScript,
    /// Bash (`bash_kernel`).
    Bash,
    /// R (`IRkernel`).
    R,
    /// Java.
    Java,
}

impl CodeLanguage {
    /// The name the helper and E2B's SDKs use.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeLanguage::Python => "python",
            CodeLanguage::JavaScript => "javascript",
            CodeLanguage::TypeScript => "typescript",
            CodeLanguage::Bash => "bash",
            CodeLanguage::R => "r",
            CodeLanguage::Java => "java",
        }
    }
}

impl fmt::Display for CodeLanguage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CodeLanguage {
    type Err = Error;

    /// Accepts the names and E2B's short forms (`js`, `ts`), in any case.
    fn from_str(name: &str) -> Result<Self> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "python" | "python3" => CodeLanguage::Python,
            "javascript" | "js" => CodeLanguage::JavaScript,
            "typescript" | "ts" => CodeLanguage::TypeScript,
            "bash" | "sh" => CodeLanguage::Bash,
            "r" => CodeLanguage::R,
            "java" => CodeLanguage::Java,
            _ => {
                return Err(Error::invalid_input(format!(
                    "no code language {name:?}: python, javascript, typescript, bash, r or java"
                )))
            }
        })
    }
}

/// A code context: a kernel with its own interpreter state, kept between runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CodeContext {
    /// Its id, unique in its interpreter.
    pub id: String,
    /// What it runs.
    pub language: CodeLanguage,
    /// Its working directory: a workspace path (`""` for the workspace itself), or an
    /// absolute path in the sandbox when outside the workspace.
    pub cwd: String,
}

/// How to run one cell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunCode {
    /// The context to run in; `None` runs in the default context of `language`.
    pub context: Option<String>,
    /// The language of the default context to run in (Python when neither is set).
    pub language: Option<CodeLanguage>,
    /// Environment variables set for this run and restored after it.
    pub env: BTreeMap<String, String>,
    /// How long the run may take before the kernel is interrupted (the context stays).
    pub timeout: Option<Duration>,
}

impl RunCode {
    /// A run in the default Python context, without a timeout.
    pub fn new() -> Self {
        RunCode::default()
    }

    /// Runs in the context with this id.
    pub fn context(mut self, id: impl Into<String>) -> Self {
        self.context = Some(id.into());
        self
    }

    /// Runs in the default context of `language`.
    pub fn language(mut self, language: CodeLanguage) -> Self {
        self.language = Some(language);
        self
    }

    /// Sets `key` to `value` for this run only.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Interrupts the run after `timeout`; it then ends with a `Timeout` error.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// One thing a run produced, in the order it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CodeEvent {
    /// The cell's number in its context.
    ExecutionCount {
        /// The number.
        count: u64,
    },
    /// Text the code wrote to standard output.
    Stdout {
        /// The text.
        text: String,
    },
    /// Text the code wrote to standard error.
    Stderr {
        /// The text.
        text: String,
    },
    /// A value displayed, or the cell's own value.
    Result(CodeResult),
    /// The error the cell raised; the context lives on.
    Error(CodeError),
    /// The run is over; nothing follows.
    End,
}

/// A displayed value as a MIME bundle (`text/plain`, `image/png` base64, `text/html`,
/// ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CodeResult {
    /// Each representation, by MIME type.
    pub data: BTreeMap<String, serde_json::Value>,
    /// Whether it is the cell's value (the last expression), not a display call's.
    #[serde(rename = "main")]
    pub is_main_result: bool,
}

impl CodeResult {
    /// The representation of type `mime` as text, if there is one.
    pub fn get(&self, mime: &str) -> Option<&str> {
        self.data.get(mime).and_then(serde_json::Value::as_str)
    }

    /// The plain-text representation, if any.
    pub fn text(&self) -> Option<&str> {
        self.get("text/plain")
    }
}

/// An error a cell raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CodeError {
    /// Its name (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback, a line per frame (with the kernel's terminal colours).
    pub traceback: Vec<String>,
}

/// Everything one run produced, gathered.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct CodeOutput {
    /// The cell's number in its context.
    pub execution_count: Option<u64>,
    /// Standard output, a piece per write.
    pub stdout: Vec<String>,
    /// Standard error, a piece per write.
    pub stderr: Vec<String>,
    /// The values displayed, the cell's own among them.
    pub results: Vec<CodeResult>,
    /// The error the cell raised, if it did.
    pub error: Option<CodeError>,
}

impl CodeEvent {
    /// About how many bytes it holds (its texts and results' values).
    pub(crate) fn size(&self) -> usize {
        match self {
            CodeEvent::Stdout { text } | CodeEvent::Stderr { text } => text.len(),
            CodeEvent::Result(result) => result
                .data
                .iter()
                .map(|(mime, value)| mime.len() + value.to_string().len())
                .sum(),
            CodeEvent::Error(error) => {
                error.name.len()
                    + error.value.len()
                    + error.traceback.iter().map(String::len).sum::<usize>()
            }
            CodeEvent::ExecutionCount { .. } | CodeEvent::End => 8,
        }
    }
}

impl CodeOutput {
    /// The cell's own value (its last expression), if it had one.
    pub fn main_result(&self) -> Option<&CodeResult> {
        self.results.iter().find(|r| r.is_main_result)
    }

    /// Adds one event.
    pub(crate) fn add(&mut self, event: CodeEvent) {
        match event {
            CodeEvent::ExecutionCount { count } => self.execution_count = Some(count),
            CodeEvent::Stdout { text } => self.stdout.push(text),
            CodeEvent::Stderr { text } => self.stderr.push(text),
            CodeEvent::Result(result) => self.results.push(result),
            CodeEvent::Error(error) => self.error = Some(error),
            CodeEvent::End => {}
        }
    }
}
