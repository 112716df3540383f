"""Which files a loadable copy of each WILDS dataset has on disk, for `raybench data check`.

One module per dataset, each with `missing_files(root: Path, unlabeled: bool) -> list[str]`.
"""
