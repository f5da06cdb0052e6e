//! The self-contained report file: the page script, its styles, the run's view and every trace
//! inlined into one HTML file that makes no network request when opened (its Content Security
//! Policy forbids any), so it can be mailed, attached to CI, or opened offline.

use super::LoadedRun;
use crate::results::markup::escape as text;
use std::io::{Seek, Write};

/// The page script every view shares: renders a [`super::RunView`].
pub const REPORT_JS: &str = include_str!("assets/report.js");
/// The styles every view shares.
pub const STYLE_CSS: &str = include_str!("assets/style.css");

/// Writes `value` to `out` as JSON made safe inside a `<script>` element: `<` never appears
/// raw, so no `</script>` or `<!--` in a trace can end the element (JSON allows `\u003c`
/// wherever `<` may be), and every held secret is redacted first. Streamed: a view of
/// 100,000 trials is never held as one string.
pub fn write_script_json(
    out: &mut dyn std::io::Write,
    value: &impl serde::Serialize,
) -> std::io::Result<()> {
    let mut out = crate::secrets::redactor().json_writer(ScriptSafe(out));
    serde_json::to_writer(&mut out, value)?;
    out.flush()
}

/// [`write_script_json`] for a document already written as JSON text (a trace's line in its
/// run's log), copied through the same redaction and escaping rather than parsed and written
/// again.
pub fn write_script_json_text(out: &mut dyn std::io::Write, json: &[u8]) -> std::io::Result<()> {
    let mut out = crate::secrets::redactor().json_writer(ScriptSafe(out));
    out.write_all(json)?;
    out.flush()
}

/// A writer that turns every `<` into `\u003c` on its way to the one it wraps.
struct ScriptSafe<W>(W);

impl<W: std::io::Write> std::io::Write for ScriptSafe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for (i, piece) in buf.split(|b| *b == b'<').enumerate() {
            if i > 0 {
                self.0.write_all(b"\\u003c")?;
            }
            self.0.write_all(piece)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Writes the whole report of `run` (stored in `dir`) to `out`, compared with `diff` when
/// given. Each trace sits in its own inert `<script type="application/json">` element, parsed
/// only when its trial is opened, so a run of 10,000 trials opens as fast as its table renders.
/// Each trace is read from `dir` once, as the view's row of its trial is written: writing the
/// report holds one trace and one row at a time.
pub fn report(
    run: crate::results::stored::StoredRun,
    dir: &crate::results::RunDir,
    diff: Option<crate::results::diff::RunDiff>,
    out: &mut dyn std::io::Write,
) -> std::io::Result<crate::results::stored::StoredRun> {
    // Results are redacted as they are written; a secret held now (one added since) is too:
    // the markup here as text, each JSON document as it is streamed out.
    let redactor = crate::secrets::redactor();
    let put = |out: &mut dyn std::io::Write, piece: &str| {
        out.write_all(redactor.redact(piece).as_bytes())
    };
    let title = format!("mst report: {} {}", run.record.eval, run.record.run_id);
    put(
        out,
        &format!(
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
         <title>{}</title>\n<style>\n{STYLE_CSS}</style>\n</head>\n<body>\n\
         <main id=\"app\"><noscript>This report needs JavaScript to draw its tables; its data \
         is in the page source.</noscript></main>\n",
            text(&title),
        ),
    )?;
    // Each trace is written to a file of its own as its row is made, and copied after the
    // view: one read of each, and nothing of it kept.
    let run = LoadedRun::without_traces(run);
    let mut traces = std::io::BufWriter::new(tempfile::tempfile()?);
    let mut write_trace = |index: usize, trace: &[u8]| {
        write!(
            traces,
            "<script type=\"application/json\" id=\"mst-trace-{index}\">"
        )?;
        write_script_json_text(&mut traces, trace)?;
        traces.write_all(b"</script>\n")
    };
    let samples = std::cell::RefCell::new(super::charts::Samples::default());
    {
        let sink: super::TraceSink<'_> = std::cell::RefCell::new(&mut write_trace);
        let mut view = run.view_reading(dir, &sink, &samples);
        view.diff = diff;
        out.write_all(b"<script type=\"application/json\" id=\"mst-view\">")?;
        write_script_json(out, &view)?;
        out.write_all(b"</script>\n")?;
    }
    // The charts as static markup, readable with scripts off; the page script moves them
    // under the variants table. Drawn after the rows, which gathered what they show.
    let charts = super::charts::run_charts(&run.run.summary, &samples.into_inner());
    if !charts.is_empty() {
        put(
            out,
            &format!(
                "<section id=\"mst-charts\" class=\"charts\" aria-labelledby=\"charts-h\">\
                 <h2 id=\"charts-h\">Charts</h2>{charts}</section>\n"
            ),
        )?;
    }
    let mut traces = traces.into_inner().map_err(|e| e.into_error())?;
    traces.rewind()?;
    std::io::copy(&mut traces, out)?;
    put(out, &format!(
        "<script>\n{REPORT_JS}</script>\n<script>\nMstReport.render(document.getElementById('app'), \
         JSON.parse(document.getElementById('mst-view').textContent), function (index) {{\n  \
         var element = document.getElementById('mst-trace-' + index);\n  \
         return Promise.resolve(element ? JSON.parse(element.textContent) : null);\n}});\n\
         </script>\n</body>\n</html>\n"
    ))?;
    Ok(run.run)
}

/// What `mst report` wrote.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Written {
    pub run_id: String,
    pub path: std::path::PathBuf,
    pub bytes: u64,
    pub trials: usize,
}

/// The report's name in a run directory, where `mst run` and `mst grade` leave one.
pub const REPORT_FILE: &str = "report.html";

/// Writes the report of the run in `dir` to `out` (its run directory's `report.html` when
/// `None`), compared with the run in `baseline` when given (`mst runs diff`'s comparison; runs of
/// another eval, or with no case in common, are refused).
pub fn write(
    dir: &crate::results::RunDir,
    out: Option<&std::path::Path>,
    baseline: Option<&crate::results::RunDir>,
) -> anyhow::Result<Written> {
    use crate::results::{diff::RunDiff, stored::StoredRun};
    let run = StoredRun::read(dir)?;
    let diff = baseline
        .map(|before| RunDiff::between(&StoredRun::read(before)?, &run))
        .transpose()?;
    write_run(run, dir, out, diff).map(|(written, _)| written)
}

/// Writes the report of `run`, stored in `dir` and already in memory (the run `mst run` or
/// `mst grade` has just graded, so its grades are not read back), as [`write`] does, and hands
/// `run` back. When the report cannot be written, `run` goes with the error.
pub fn write_run(
    run: crate::results::stored::StoredRun,
    dir: &crate::results::RunDir,
    out: Option<&std::path::Path>,
    diff: Option<crate::results::diff::RunDiff>,
) -> anyhow::Result<(Written, crate::results::stored::StoredRun)> {
    let path = out.map_or_else(|| dir.root.join(REPORT_FILE), std::path::Path::to_path_buf);
    let (run_id, trials) = (run.record.run_id.clone(), run.record.trials.len());
    let mut back = None;
    crate::files::write_atomic_with(&path, |out| {
        back = Some(report(run, dir, diff, out)?);
        Ok(())
    })?;
    let written = Written {
        run_id,
        bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
        path,
        trials,
    };
    Ok((written, back.expect("a written report hands its run back")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` as the report inlines it.
    fn script_json(value: &serde_json::Value) -> String {
        let mut json = Vec::new();
        write_script_json(&mut json, value).unwrap();
        String::from_utf8(json).unwrap()
    }

    #[test]
    fn json_in_a_script_element_never_holds_a_raw_angle_bracket() {
        let hostile = serde_json::json!({"text": "</script><script>alert(1)</script><!--"});
        let inlined = script_json(&hostile);
        assert!(!inlined.contains('<'), "{inlined}");
        let back: serde_json::Value = serde_json::from_str(&inlined).unwrap();
        assert_eq!(back, hostile);
    }

    #[test]
    fn a_held_secret_is_redacted_before_its_angle_brackets_are_escaped() {
        // Escaped first, `can<ary…` would reach the page as `can\u003cary…`, which no
        // redactor looks for.
        let canary = "can<ary-3f8e1d-only-in-this-test";
        crate::secrets::hold("HTML_TEST_CANARY", &crate::secrets::Secret::new(canary));
        let inlined = script_json(&serde_json::json!({"said": format!("the key is {canary}")}));
        assert!(!inlined.contains("ary-3f8e1d"), "{inlined}");
        let back: serde_json::Value = serde_json::from_str(&inlined).unwrap();
        assert_eq!(back["said"], "the key is [redacted:HTML_TEST_CANARY]");
    }

    #[test]
    fn json_text_copied_into_a_script_is_escaped_and_redacted_as_json_written_there_is() {
        let canary = "can<ary-77c2a0-only-in-this-test";
        crate::secrets::hold("HTML_TEXT_CANARY", &crate::secrets::Secret::new(canary));
        let trace = serde_json::json!({
            "text": "</script><script>alert(1)</script><!--",
            "said": format!("the key is {canary}"),
        });
        let mut copied = Vec::new();
        write_script_json_text(&mut copied, &serde_json::to_vec(&trace).unwrap()).unwrap();
        let copied = String::from_utf8(copied).unwrap();
        assert_eq!(copied, script_json(&trace));
        assert!(
            !copied.contains('<') && !copied.contains("ary-77c2a0"),
            "{copied}"
        );
    }

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            text("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
