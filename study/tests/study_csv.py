"""CSV files for the study's tests: rows (dicts) written under a header of ``fields``, a column
a row lacks left empty, as the study's CSVs hold a value not measured."""

import csv


def write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in fields})
