//! Per-trial images: a case's `image`, else its variant's, else the runner's own. The Docker
//! runner honours them, each shard running in one image (the trials are grouped so); any other
//! runner refuses a run that names one, before anything starts.

use crate::eval::config::EvalConfig;
use crate::eval::dataset::Cases;
use crate::eval::per_trial::CaseOrVariant;
use anyhow::{bail, Result};

/// The image each trial runs in, where the eval names one: its case's, else its variant's.
pub type TrialImages = CaseOrVariant<String>;

/// The images `config`'s variants and `cases` name, each checked to be a plain reference.
pub fn of_run(config: &EvalConfig, cases: &Cases) -> Result<TrialImages> {
    let mut images = TrialImages::default();
    for (name, variant) in &config.variants {
        if let Some(image) = &variant.image {
            check(image, &format!("`variants.{name}.image`"))?;
            images.variants.insert(name.clone(), image.clone());
        }
    }
    for (index, case) in cases.iter().enumerate() {
        let case = case?;
        if let Some(image) = &case.more().image {
            check(
                image,
                &format!("case `{}` ({}): `image`", case.id, cases.origin(index)),
            )?;
            images.cases.insert(case.id.to_string(), image.clone());
        }
    }
    Ok(images)
}

/// Refuses `images`, and `freshMachine` (`fresh`), on a runner that cannot honour them (any
/// but `docker`, whose hosts' room bounds how many machines start at once).
pub fn refuse_unless_docker(images: &TrialImages, runner: &str, fresh: bool) -> Result<()> {
    if fresh && runner != "docker" {
        bail!(
            "`freshMachine` gives each trial a container of its own: it runs on `--runner \
             docker` only (runner `{runner}` would start a machine per trial at once)"
        );
    }
    let named = (images
        .cases
        .iter()
        .map(|(id, image)| format!("case `{id}`: {image}")))
    .chain((images.variants.iter()).map(|(v, image)| format!("variant `{v}`: {image}")))
    .next();
    match named {
        Some(named) if runner != "docker" => bail!(
            "{named}: trials that name an image run on `--runner docker` only (runner \
             `{runner}` runs every trial on its own machines); remove the `image`, or use \
             the docker runner"
        ),
        _ => Ok(()),
    }
}

/// Refuses an image reference that is empty or holds whitespace or control characters.
fn check(image: &str, place: &str) -> Result<()> {
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("{place} is {image:?}: name an image as Docker does, e.g. `mst-task/fix-add:1`");
    }
    Ok(())
}
