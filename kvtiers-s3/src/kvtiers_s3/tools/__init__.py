"""What `kvtiers inspect`, `verify` and `snapshot` ask of the s3 tier: `survey` (every
namespace under the prefix, without building the tier; what a built tier holds)
and `verify` (every held object re-read and re-checked, damaged ones of ours
removed with `repair`)."""
