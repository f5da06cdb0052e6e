//! The self-contained report file: the page script, its styles, the run's view and every trace
//! inlined into one HTML file that makes no network request when opened (its Content Security
//! Policy forbids any), so it can be mailed, attached to CI, or opened offline.

use super::LoadedRun;
use crate::results::report::escape as text;

/// The page script every view shares: renders a [`super::RunView`].
pub const REPORT_JS: &str = include_str!("assets/report.js");
/// The styles every view shares.
pub const STYLE_CSS: &str = include_str!("assets/style.css");

/// JSON made safe inside a `<script>` element: `<` never appears raw, so no `</script>` or
/// `<!--` in a trace can end the element (JSON allows `\u003c` wherever `<` may be).
pub fn script_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    json.replace('<', "\\u003c")
}

/// Writes the whole report of `run` (stored in `dir`) to `out`, compared with `diff` when
/// given. Each trace sits in its own inert `<script type="application/json">` element, parsed
/// only when its trial is opened, so a run of 10,000 trials opens as fast as its table renders;
/// and each is read from `dir`, written and dropped in turn, so writing the report holds the
/// view in memory, never the traces.
pub fn report(
    run: &LoadedRun,
    dir: &crate::results::RunDir,
    diff: Option<crate::results::diff::RunDiff>,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    // Results are redacted as they are written; a secret held now (one added since) is too.
    // Each piece is a whole JSON document or fixed markup, so no secret spans two.
    let redactor = crate::secrets::redactor();
    let mut put = |piece: &str| out.write_all(redactor.redact(piece).as_bytes());
    let mut view = run.view();
    view.diff = diff;
    let title = format!(
        "mst report: {} {}",
        run.run.record.eval, run.run.record.run_id
    );
    put(&format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
         <title>{}</title>\n<style>\n{STYLE_CSS}</style>\n</head>\n<body>\n\
         <main id=\"app\"><noscript>This report needs JavaScript to draw its tables; its data \
         is in the page source.</noscript></main>\n\
         <script type=\"application/json\" id=\"mst-view\">{}</script>\n",
        text(&title),
        script_json(&view)
    ))?;
    drop(view);
    for (index, key) in run.run.record.trials.iter().enumerate() {
        if let Some(trace) = run.run.read_trace(dir, key) {
            put(&format!(
                "<script type=\"application/json\" id=\"mst-trace-{index}\">{}</script>\n",
                script_json(&trace)
            ))?;
        }
    }
    put(&format!(
        "<script>\n{REPORT_JS}</script>\n<script>\nMstReport.render(document.getElementById('app'), \
         JSON.parse(document.getElementById('mst-view').textContent), function (index) {{\n  \
         var element = document.getElementById('mst-trace-' + index);\n  \
         return Promise.resolve(element ? JSON.parse(element.textContent) : null);\n}});\n\
         </script>\n</body>\n</html>\n"
    ))
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
    let run = LoadedRun::read(dir)?;
    let diff = baseline
        .map(|before| RunDiff::between(&StoredRun::read(before)?, &run.run))
        .transpose()?;
    let path = out.map_or_else(|| dir.root.join(REPORT_FILE), std::path::Path::to_path_buf);
    crate::files::write_atomic_with(&path, |out| report(&run, dir, diff, out))?;
    Ok(Written {
        run_id: run.run.record.run_id.clone(),
        bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
        path,
        trials: run.run.record.trials.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_in_a_script_element_never_holds_a_raw_angle_bracket() {
        let hostile = serde_json::json!({"text": "</script><script>alert(1)</script><!--"});
        let inlined = script_json(&hostile);
        assert!(!inlined.contains('<'), "{inlined}");
        let back: serde_json::Value = serde_json::from_str(&inlined).unwrap();
        assert_eq!(back, hostile);
    }

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            text("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
