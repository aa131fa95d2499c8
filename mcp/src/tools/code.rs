//! The `run_code` tool: stateful code in a session's sandbox ([`sandcell::code`]), one
//! interpreter per sandbox, kept between calls (and across the MCP sessions of a
//! server) so variables, imports and loaded data stay.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use sandcell::code::{CodeLanguage, CodeOutput, RunCode as Run};
use sandcell::ErrorKind;

use super::calls::Answer;
use super::SandboxTools;
use crate::args::RunCode;
use crate::output::HeadTail;

#[tool_router(router = code_router, vis = "pub(super)")]
impl SandboxTools {
    /// Runs code in a session's stateful interpreter.
    #[tool(
        description = "Run code in a session's sandbox, in a Jupyter kernel that keeps its \
        state between calls (variables, imports, loaded data), like a notebook cell. \
        Answers what it printed, its last expression's value, images it displayed (as \
        images), and the error it raised with its traceback. Python by default; the \
        sandbox needs jupyter-client and the language's kernel (the error says what to \
        install). A run past timeout_secs (default 120) is interrupted; the state stays."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCode>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        let _slot = match self.tenant(&ctx).and_then(|t| self.calls.slot(&t)) {
            Ok(slot) => slot,
            Err(e) => return self.failed(e),
        };
        match self.run_cell(&ctx, args).await {
            Ok(answer) => Ok(answer),
            Err(e) => self.failed(e),
        }
    }
}

impl SandboxTools {
    async fn run_cell(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: RunCode,
    ) -> sandcell::Result<CallToolResult> {
        let language = match &args.language {
            Some(name) => name.parse()?,
            None => CodeLanguage::Python,
        };
        let timeout = Duration::from_secs(args.timeout_secs.unwrap_or(120).clamp(1, 3600));
        let handle = self.open(ctx, &args.session).await?;
        let id = handle.id().clone();
        let interpreter = self
            .interpreters
            .get_or_start(self.manager.backend(), &id)
            .await?;
        let run = Run::new().language(language).timeout(timeout);
        let output = interpreter.run_to_end(&args.code, run).await;
        // A cell is activity: the session is not idle while a model works in it.
        handle.touch().await;
        let output = match output {
            Err(e) if e.kind() == ErrorKind::Timeout => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "Timeout: {e} (the interpreter's state is kept; give a longer \
                     timeout_secs, or run less at once)"
                ))]))
            }
            other => other?,
        };
        Ok(self.rendered(&output))
    }

    /// The run as a model reads it: text (each part sized by the output limit), then
    /// its images.
    fn rendered(&self, output: &CodeOutput) -> CallToolResult {
        let limit = self.settings.output_limit;
        let sized = |text: &str| {
            let mut kept = HeadTail::new(limit);
            kept.push(text.as_bytes());
            kept.text()
        };
        let mut text = String::new();
        for (name, parts) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
            if !parts.is_empty() {
                text.push_str(&format!("[{name}]\n{}\n", sized(&parts.concat())));
            }
        }
        let mut images = Vec::new();
        for result in &output.results {
            for mime in ["image/png", "image/jpeg", "image/svg+xml"] {
                if let Some(data) = result.get(mime) {
                    images.push(ContentBlock::image(data, mime));
                }
            }
            let shown = result.text().map(sized);
            match (result.is_main_result, shown) {
                (true, Some(value)) => text.push_str(&format!("[value]\n{value}\n")),
                (false, Some(value)) => text.push_str(&format!("[display]\n{value}\n")),
                _ => {}
            }
        }
        let failed = output.error.is_some();
        if let Some(error) = &output.error {
            let traceback = strip_ansi(&error.traceback.join("\n"));
            text.push_str(&format!(
                "[error] {}: {}\n{}\n",
                error.name,
                error.value,
                sized(&traceback)
            ));
        }
        if text.is_empty() {
            text.push_str("(no output)");
        }
        let mut blocks = vec![ContentBlock::text(text)];
        blocks.extend(images);
        if failed {
            CallToolResult::error(blocks)
        } else {
            CallToolResult::success(blocks)
        }
    }
}

/// `text` without terminal colour codes (kernels colour their tracebacks).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then one final byte in @..~.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_codes_are_stripped() {
        let coloured = "\u{1b}[31mZeroDivisionError\u{1b}[39m: x \u{1b}[38;5;28;01mraise\u{1b}[0m";
        assert_eq!(super::strip_ansi(coloured), "ZeroDivisionError: x raise");
    }
}
