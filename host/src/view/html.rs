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
/// only when its trial is opened, so a run of 10,000 trials opens as fast as its table renders.
/// Each trace is read from `dir` once, written and dropped in turn, and the view (whose rows
/// need only each trace's facts) follows them: writing the report holds the view in memory,
/// never the traces.
pub fn report(
    run: crate::results::stored::StoredRun,
    dir: &crate::results::RunDir,
    diff: Option<crate::results::diff::RunDiff>,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    // Results are redacted as they are written; a secret held now (one added since) is too.
    // Each piece is a whole JSON document or fixed markup, so no secret spans two.
    let redactor = crate::secrets::redactor();
    let mut put = |piece: &str| out.write_all(redactor.redact(piece).as_bytes());
    let title = format!("mst report: {} {}", run.record.eval, run.record.run_id);
    put(&format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
         <title>{}</title>\n<style>\n{STYLE_CSS}</style>\n</head>\n<body>\n\
         <main id=\"app\"><noscript>This report needs JavaScript to draw its tables; its data \
         is in the page source.</noscript></main>\n",
        text(&title),
    ))?;
    let run = LoadedRun::gather(run, dir, |index, trace| {
        put(&format!(
            "<script type=\"application/json\" id=\"mst-trace-{index}\">{}</script>\n",
            script_json(trace)
        ))
    })?;
    let mut view = run.view();
    view.diff = diff;
    put(&format!(
        "<script type=\"application/json\" id=\"mst-view\">{}</script>\n",
        script_json(&view)
    ))?;
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
    let run = StoredRun::read(dir)?;
    let diff = baseline
        .map(|before| RunDiff::between(&StoredRun::read(before)?, &run))
        .transpose()?;
    let path = out.map_or_else(|| dir.root.join(REPORT_FILE), std::path::Path::to_path_buf);
    let (run_id, trials) = (run.record.run_id.clone(), run.record.trials.len());
    crate::files::write_atomic_with(&path, |out| report(run, dir, diff, out))?;
    Ok(Written {
        run_id,
        bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
        path,
        trials,
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
