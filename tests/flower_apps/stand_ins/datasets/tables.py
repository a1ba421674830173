"""The tabular data sets of the ``datasets`` stand-in, built from a seeded generator.

Each builder gets the generator of one split (seeded by the data set's name and the
split, :mod:`datasets.hub`) and the number of rows, and returns rows with the hub data
set's column names, dtypes and kinds of values. The target column depends on the
features through a fixed rule plus noise, so a model can learn it, and every split of
a data set follows the same rule.
"""

from __future__ import annotations

import numpy as np

from datasets.dataset import Dataset

IRIS_SPECIES = ("Iris-setosa", "Iris-versicolor", "Iris-virginica")
# Per species: the mean and spread of sepal length, sepal width, petal length, petal
# width (cm), roughly those of Fisher's iris measurements.
IRIS_MEANS = ((5.0, 3.4, 1.5, 0.2), (5.9, 2.8, 4.3, 1.3), (6.6, 3.0, 5.6, 2.0))
IRIS_SPREADS = ((0.35, 0.38, 0.17, 0.1), (0.52, 0.31, 0.47, 0.2), (0.64, 0.32, 0.55, 0.27))


def iris(rng: np.random.Generator, rows: int) -> Dataset:
    """``scikit-learn/iris``: an equal number of rows a species."""
    species = np.repeat(np.arange(len(IRIS_SPECIES)), rows // len(IRIS_SPECIES))
    means, spreads = np.array(IRIS_MEANS)[species], np.array(IRIS_SPREADS)[species]
    # One decimal, as measured; kept within (0, 10) cm, where every histogram of the
    # examples has its bins.
    sizes = np.clip(np.round(rng.normal(means, spreads), 1), 0.1, 9.9)
    columns = ("SepalLengthCm", "SepalWidthCm", "PetalLengthCm", "PetalWidthCm")
    return Dataset(
        {
            "Id": np.arange(1, len(species) + 1),
            **{column: sizes[:, i] for i, column in enumerate(columns)},
            "Species": np.array(IRIS_SPECIES)[species],
        }
    )


HIGGS_FEATURES = 28


def higgs(rng: np.random.Generator, rows: int) -> Dataset:
    """``jxie/higgs``: ``inputs``, a sequence of 28 float32 features a row, and
    ``label`` (1.0 for signal, about half the rows, 0.0 for background)."""
    inputs = rng.standard_normal((rows, HIGGS_FEATURES), dtype=np.float32)
    noise = rng.standard_normal(rows, dtype=np.float32)
    score = inputs[:, 0] * inputs[:, 1] + inputs[:, 2] - 0.5 * inputs[:, 25] + 0.7 * noise
    return Dataset({"inputs": inputs, "label": (score > -0.1).astype(np.float32)})


# (value, share) of the adult census' categorical columns: their real values, a few
# rare ones left out; "?" is how the data set writes an unknown value.
WORKCLASS = {
    "Private": 0.70,
    "Self-emp-not-inc": 0.08,
    "Local-gov": 0.06,
    "?": 0.06,
    "State-gov": 0.04,
    "Self-emp-inc": 0.03,
    "Federal-gov": 0.03,
}
# education -> its education.num
EDUCATION = {
    "HS-grad": 9,
    "Some-college": 10,
    "Bachelors": 13,
    "Masters": 14,
    "Assoc-voc": 11,
    "11th": 7,
    "Assoc-acdm": 12,
    "10th": 6,
    "7th-8th": 4,
    "Prof-school": 15,
    "9th": 5,
    "Doctorate": 16,
}
EDUCATION_SHARES = (0.33, 0.23, 0.17, 0.06, 0.04, 0.04, 0.03, 0.03, 0.02, 0.02, 0.02, 0.01)
OCCUPATION = (
    "Prof-specialty",
    "Craft-repair",
    "Exec-managerial",
    "Adm-clerical",
    "Sales",
    "Other-service",
    "Machine-op-inspct",
    "?",
    "Transport-moving",
    "Handlers-cleaners",
    "Farming-fishing",
    "Tech-support",
    "Protective-serv",
)
RACE = {
    "White": 0.85,
    "Black": 0.10,
    "Asian-Pac-Islander": 0.03,
    "Amer-Indian-Eskimo": 0.01,
    "Other": 0.01,
}
COUNTRY = {
    "United-States": 0.90,
    "Mexico": 0.03,
    "?": 0.02,
    "Philippines": 0.01,
    "Germany": 0.01,
    "Canada": 0.01,
    "India": 0.01,
    "Puerto-Rico": 0.01,
}
UNMARRIED = ("Never-married", "Divorced", "Separated", "Widowed")


def adult_census_income(rng: np.random.Generator, rows: int) -> Dataset:
    """``scikit-learn/adult-census-income``: the census' 14 columns (ints and strings)
    and ``income``, ``">50K"`` for about a quarter of the rows, else ``"<=50K"``."""
    age = np.clip(np.round(rng.normal(38.6, 13.6, rows)), 17, 90).astype(np.int64)
    education = rng.choice(list(EDUCATION), rows, p=EDUCATION_SHARES)
    education_num = np.array([EDUCATION[name] for name in education], dtype=np.int64)
    male = rng.random(rows) < 0.67
    married = rng.random(rows) < np.clip((age - 20) / 30, 0.05, 0.6)
    gain = np.where(rng.random(rows) < 0.08, rng.integers(1_000, 30_000, rows), 0)
    hours = np.clip(np.round(rng.normal(40.4, 12.3, rows)), 1, 99).astype(np.int64)
    logit = (
        -10.0
        + 0.45 * education_num
        + 2.2 * married
        + 0.03 * age
        + 0.03 * hours
        + 0.5 * male
        + 0.0002 * gain
        + rng.logistic(0, 0.6, rows)
    )
    return Dataset(
        {
            "age": age,
            "workclass": rng.choice(list(WORKCLASS), rows, p=list(WORKCLASS.values())),
            "fnlwgt": rng.integers(12_285, 1_484_705, rows),
            "education": education,
            "education.num": education_num,
            "marital.status": np.where(married, "Married-civ-spouse", rng.choice(UNMARRIED, rows)),
            "occupation": rng.choice(OCCUPATION, rows),
            "relationship": np.where(
                married,
                np.where(male, "Husband", "Wife"),
                rng.choice(["Not-in-family", "Own-child", "Unmarried", "Other-relative"], rows),
            ),
            "race": rng.choice(list(RACE), rows, p=list(RACE.values())),
            "sex": np.where(male, "Male", "Female"),
            "capital.gain": gain,
            "capital.loss": np.where(rng.random(rows) < 0.05, rng.integers(200, 4_000, rows), 0),
            "hours.per.week": hours,
            "native.country": rng.choice(list(COUNTRY), rows, p=list(COUNTRY.values())),
            "income": np.where(logit > 0, ">50K", "<=50K"),
        }
    )


MALE_NAMES = ("John", "William", "Thomas", "James", "Charles", "Henry", "George", "Edward")
FEMALE_NAMES = ("Mary", "Anna", "Elizabeth", "Margaret", "Ellen", "Alice", "Emily", "Helen")
LAST_NAMES = (
    "Smith",
    "Brown",
    "Kelly",
    "Andersson",
    "Johnson",
    "Sage",
    "Goodwin",
    "Carter",
    "Harris",
    "Allen",
    "Baker",
    "Murphy",
    "Nilsson",
    "Taylor",
    "Walker",
    "Ford",
)


def titanic_survival(rng: np.random.Generator, rows: int) -> Dataset:
    """``julien-c/titanic-survival``: ``Survived`` (0/1, about 40 % survived),
    ``Pclass``, ``Name`` (title first: ``"Mr. John Smith"``), ``Sex``, ``Age``, the
    counts of relatives aboard and ``Fare``."""
    pclass = rng.choice([1, 2, 3], rows, p=[0.24, 0.21, 0.55])
    female = rng.random(rows) < 0.35
    age = np.clip(np.round(rng.normal(29.5, 14.0, rows)), 1, 80).astype(np.float64)
    spouses = rng.choice([0, 1, 2, 3, 4], rows, p=[0.68, 0.24, 0.04, 0.02, 0.02])
    parents = rng.choice([0, 1, 2, 3], rows, p=[0.76, 0.13, 0.09, 0.02])
    fare = np.round(np.exp(rng.normal(np.array([4.2, 3.0, 2.2])[pclass - 1], 0.5)), 4)
    title = np.where(
        female,
        np.where(spouses > 0, "Mrs", "Miss"),
        np.where(age < 13, "Master", rng.choice(["Mr", "Mr", "Mr", "Mr", "Dr", "Rev"], rows)),
    )
    first = np.where(female, rng.choice(FEMALE_NAMES, rows), rng.choice(MALE_NAMES, rows))
    last = rng.choice(LAST_NAMES, rows)
    logit = 2.6 * female - 1.0 * (pclass - 2) - 0.03 * (age - 30) - 1.1 + rng.logistic(0, 0.5, rows)
    return Dataset(
        {
            "Survived": (logit > 0).astype(np.int64),
            "Pclass": pclass.astype(np.int64),
            "Name": np.array([f"{t}. {f} {n}" for t, f, n in zip(title, first, last, strict=True)]),
            "Sex": np.where(female, "female", "male"),
            "Age": age,
            "Siblings/Spouses Aboard": spouses.astype(np.int64),
            "Parents/Children Aboard": parents.astype(np.int64),
            "Fare": fare,
        }
    )
